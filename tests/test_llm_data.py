"""GSM8k-format data: the readers on files written here, the prompt stream, the synthetic
generator, the local tokenizer, and the data module's validation."""

from __future__ import annotations

import json
import random
from fractions import Fraction

import pytest

from vaco.llm.data import GSM8kDataModule, PromptStream, format_prompt, read_gsm8k
from vaco.llm.reward import gsm8k_reward
from vaco.llm.synthetic import FAMILIES, generate_problems, generate_splits, teacher_answer, write_jsonl

RECORDS = [
    {
        "question": "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
        "How many clips did Natalia sell altogether in April and May?",
        "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips.\n#### 72",
    },
    {"question": "A house costs $1,200,000. What is it in thousands?", "answer": "1200000/1000=1200\n#### 1,200"},
    {"question": "What is 3 minus 5?", "answer": "3-5=-2\n#### -2"},
]


def write_lines(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return str(path)


def test_read_gsm8k_jsonl(tmp_path):
    path = write_lines(tmp_path / "train.jsonl", RECORDS)
    records = read_gsm8k(path)
    assert [r["target"] for r in records] == [Fraction(72), Fraction(1200), Fraction(-2)]
    assert records[0]["question"] == RECORDS[0]["question"]
    assert gsm8k_reward("so #### 72", records[0]["answer"]) == 1.0


def test_read_gsm8k_parquet_and_json(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(RECORDS), tmp_path / "test-00000-of-00001.parquet")
    assert [r["target"] for r in read_gsm8k(str(tmp_path / "test-00000-of-00001.parquet"))] == [72, 1200, -2]
    (tmp_path / "t.json").write_text(json.dumps(RECORDS))
    assert len(read_gsm8k(str(tmp_path / "t.json"))) == 3


def test_read_gsm8k_custom_keys(tmp_path):
    path = write_lines(tmp_path / "d.jsonl", [{"problem": "1+1?", "solution": "#### 2"}])
    assert read_gsm8k(path, question_key="problem", answer_key="solution")[0]["target"] == 2


@pytest.mark.parametrize(
    "content,match",
    [
        ('{"question": "q"}\n', r"`data.train_path`: record 1 .* needs keys 'question' and 'answer'"),
        ('{"question": "q", "answer": "no number here"}\n', r"`data.train_path`: record 1 .*####"),
        ('{"question": "q", "answer": "#### 1"}\nnot json\n', r"`data.train_path`: .* line 2 is not JSON"),
        ("", r"`data.train_path`: .* no records"),
    ],
)
def test_read_gsm8k_errors_name_the_field_and_record(tmp_path, content, match):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(ValueError, match=match):
        read_gsm8k(str(path), "data.train_path")


def test_read_gsm8k_missing_file_and_format(tmp_path):
    with pytest.raises(FileNotFoundError, match="`data.test_path`"):
        read_gsm8k(str(tmp_path / "nope.jsonl"), "data.test_path")
    (tmp_path / "x.csv").write_text("question,answer\n")
    with pytest.raises(ValueError, match=r"\.jsonl, \.json or \.parquet"):
        read_gsm8k(str(tmp_path / "x.csv"))


def test_prompt_stream_is_a_function_of_seed_and_position():
    prompts = [f"p{i}" for i in range(10)]
    targets = [Fraction(i) for i in range(10)]
    full = list(PromptStream(prompts, targets, batch_size=4, minibatches=2, num_items=5, seed=3))
    assert len(full) == 5 and all(len(item) == 2 and len(item[0]["prompt"]) == 4 for item in full)
    # every pass over the data (10 prompts) is a permutation; passes are shuffled differently
    flat = [p for item in full for mb in item for p in mb["prompt"]]
    assert sorted(flat[:10]) == sorted(prompts) and sorted(flat[10:20]) == sorted(prompts)
    assert flat[:10] != flat[10:20]
    assert all(int(p[1:]) == int(t) for item in full for mb in item for p, t in zip(mb["prompt"], mb["target"]))
    # resuming at item 3 continues the same stream
    resumed = list(PromptStream(prompts, targets, batch_size=4, minibatches=2, num_items=5, seed=3, start=3))
    assert resumed == full[3:]
    assert list(PromptStream(prompts, targets, 4, 2, 5, seed=4)) != full


def test_synthetic_splits_are_disjoint_and_in_gsm8k_format(tmp_path):
    splits = generate_splits(num_train=300, num_test=100, num_sft=200, seed=0)
    questions = [{p["question"] for p in splits[k]} for k in ("train", "test", "sft")]
    assert not (questions[0] & questions[1]) and not (questions[2] & (questions[0] | questions[1]))
    write_jsonl(splits["test"], str(tmp_path / "test.jsonl"))
    records = read_gsm8k(str(tmp_path / "test.jsonl"), "data.test_path")
    assert len(records) == 100 and set(json.loads((tmp_path / "test.jsonl").read_text().splitlines()[0])) == {
        "question",
        "answer",
    }
    # every reference solves its own problem: the reasoning's last line is the answer
    for p, r in zip(splits["test"], records):
        assert gsm8k_reward(p["answer"], p["answer"]) == 1.0 and r["target"] == int(p["answer"].split("#### ")[-1])
    assert {p["family"] for p in splits["train"]} == set(FAMILIES)


def test_teacher_mistakes_follow_their_rates():
    problems = generate_problems(600, seed=1, families=["buy_then_give"])
    rng = random.Random(0)
    wrong = sum(gsm8k_reward(teacher_answer(p, rng, {"buy_then_give": 0.7}), p["answer"]) == 0 for p in problems)
    assert 0.6 < wrong / 600 < 0.8  # binomial(600, 0.7): 0.7 +- 4 std
    assert all(gsm8k_reward(teacher_answer(p, rng, {"buy_then_give": 0.0}), p["answer"]) == 1 for p in problems)


def test_local_tokenizer_round_trips_and_spells_digits(tmp_path):
    from transformers import AutoTokenizer

    from vaco.llm.tokenizer import train_tokenizer

    texts = [
        format_prompt("Question: {question}\nAnswer:", p["question"]) + " " + p["answer"]
        for p in generate_problems(300, seed=2)
    ]
    tokenizer = train_tokenizer(texts, vocab_size=400)
    tokenizer.save_pretrained(str(tmp_path / "tok"))
    loaded = AutoTokenizer.from_pretrained(str(tmp_path / "tok"), local_files_only=True)
    for text in texts[:20] + ["unseen: \u00e9t\u00e9 \u2211 {x} 1234567"]:
        assert loaded.decode(loaded(text)["input_ids"]) == text
    pieces = loaded.convert_ids_to_tokens(loaded(" 1234")["input_ids"])
    assert [p.lstrip("\u0120") for p in pieces] == ["1", "2", "3", "4"]
    assert loaded.eos_token == "<|endoftext|>" and loaded.pad_token == "<|pad|>"


def test_data_module_validates_before_any_work(tmp_path):
    path = write_lines(tmp_path / "train.jsonl", RECORDS)
    with pytest.raises(FileNotFoundError, match="`data.test_path`"):
        GSM8kDataModule(train_path=path, test_path=str(tmp_path / "missing.jsonl"))
    with pytest.raises(FileNotFoundError, match="`data.train_path`"):
        GSM8kDataModule(train_path="/no/such/gsm8k/train.jsonl", test_path=path)
    for field, value in (("prompts_per_minibatch", 0), ("num_steps", -1), ("eval_every", 1.5), ("num_eval", 0)):
        with pytest.raises(ValueError, match=f"`data.{field}`"):
            GSM8kDataModule(train_path=path, test_path=path, **{field: value})
    with pytest.raises(ValueError, match="`data.prompt_template`"):
        GSM8kDataModule(train_path=path, test_path=path, prompt_template="Q: {q}")


# ---------------------------------------------------------------- other datasets: formats, fields, rewards
MATH_RECORDS = [
    {"problem": "What is $\\frac{1}{2} + \\frac{1}{4}$?", "solution": "It is $\\boxed{\\frac{3}{4}}$."},
    {"problem": "Solve $2x = 10$.", "solution": "Divide by 2: $x = \\boxed{5}$."},
]


def test_a_boxed_dataset_loads_with_a_field_map_and_the_boxed_reward(tmp_path):
    from vaco.llm.reward import BoxedMath

    path = write_lines(tmp_path / "math.jsonl", MATH_RECORDS)
    data = GSM8kDataModule(
        train_path=path, test_path=path, question_key="problem", answer_key="solution", reward=BoxedMath()
    )
    assert [r["target"] for r in data.train] == ["\\frac{3}{4}", "5"]
    assert data.score(["\\boxed{0.75}", "x = 5"], [r["target"] for r in data.train]) == [1.0, 0.0]
    # GSM8k's reward (the default) cannot read a boxed solution: one line naming the record and the key
    with pytest.raises(
        ValueError, match=r"^`data.train_path`: record 1 of .*math.jsonl: GSM8k cannot read its 'solution'"
    ):
        GSM8kDataModule(train_path=path, test_path=path, question_key="problem", answer_key="solution")
    # the keys a record lacks are named with the options that set them
    with pytest.raises(ValueError, match=r"needs keys 'question' and 'answer' \(data.question_key, data.answer_key\)"):
        GSM8kDataModule(train_path=path, test_path=path, reward=BoxedMath())
    broken = write_lines(tmp_path / "broken.jsonl", [*MATH_RECORDS, {"problem": "?", "solution": "\\boxed{1"}])
    with pytest.raises(ValueError, match=r"record 3 of .*broken.jsonl: BoxedMath cannot read .*never closes"):
        GSM8kDataModule(
            train_path=broken, test_path=path, question_key="problem", answer_key="solution", reward=BoxedMath()
        )


def test_a_datasets_save_to_disk_folder_loads_and_a_dataset_dict_names_its_splits(tmp_path):
    datasets = pytest.importorskip("datasets")
    from vaco.llm.reward import BoxedMath

    folder = tmp_path / "math"
    datasets.Dataset.from_list(MATH_RECORDS).save_to_disk(str(folder))
    data = GSM8kDataModule(
        train_path=str(folder), test_path=str(folder), question_key="problem", answer_key="solution", reward=BoxedMath()
    )
    assert [r["question"] for r in data.train] == [r["problem"] for r in MATH_RECORDS]
    both = tmp_path / "both"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(MATH_RECORDS)}).save_to_disk(str(both))
    with pytest.raises(
        ValueError, match=r"DatasetDict with splits \['train'\]; give one split's folder, e.g. .*both/train"
    ):
        GSM8kDataModule(train_path=str(both), test_path=str(folder))
    (tmp_path / "plain").mkdir()
    with pytest.raises(ValueError, match="not one written by datasets' save_to_disk"):
        GSM8kDataModule(train_path=str(tmp_path / "plain"), test_path=str(folder))


def test_the_chat_template_wraps_prompts_when_the_tokenizer_has_one(tmp_path):
    from vaco.llm.tokenizer import train_tokenizer

    path = write_lines(tmp_path / "train.jsonl", RECORDS)
    tokenizer = train_tokenizer([r["question"] for r in RECORDS] * 5, vocab_size=300)
    data = GSM8kDataModule(train_path=path, test_path=path, prompt_template="Q: {question}")
    data.tokenizer = tokenizer
    assert data.prompt("2+2?") == "Q: 2+2?"  # no template on this tokenizer: the prompt as it is
    tokenizer.chat_template = (
        "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    assert data.prompt("2+2?") == "<|user|>Q: 2+2?<|end|><|assistant|>"
    off = GSM8kDataModule(train_path=path, test_path=path, chat_template=False)
    off.tokenizer = tokenizer
    assert off.prompt("2+2?") == "Question: 2+2?\nAnswer:"
    tokenizer.chat_template = None
    forced = GSM8kDataModule(train_path=path, test_path=path, chat_template=True)
    forced.tokenizer = tokenizer
    with pytest.raises(ValueError, match="`data.chat_template` is true but the model's tokenizer has no chat template"):
        forced.prompt("2+2?")
    with pytest.raises(ValueError, match="`data.chat_template` must be true, false or null"):
        GSM8kDataModule(train_path=path, test_path=path, chat_template="yes")
    with pytest.raises(ValueError, match="`data.reward` must be a vaco.llm.reward.Reward"):
        GSM8kDataModule(train_path=path, test_path=path, reward=len)


def test_an_oversized_question_or_a_decompression_bomb_is_refused_in_one_line_before_it_is_tokenized(
    tmp_path, monkeypatch
):
    """A question of more characters than a prompt may have is refused naming its record (it was
    tokenized whole first: a 200 MB line grew to 22.5 GB); a parquet file whose row groups hold more
    than vaco reads, by its metadata, before anything is decompressed (a 2.3 KB file that expands to
    1 GB grew to 24.1 GB). The bound is lowered here so that the files stay small."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    import vaco.llm.data as D

    long = write_lines(
        tmp_path / "long.jsonl", [RECORDS[0], {"question": "x" * (D.MAX_QUESTION_CHARS + 1), "answer": "#### 1"}]
    )
    with pytest.raises(ValueError, match=r"`data.train_path`: record 2 of .*: its 'question' is 1,000,001 characters"):
        read_gsm8k(long, "data.train_path")
    monkeypatch.setattr(D, "MAX_DATA_BYTES", 1 << 20)
    bomb = tmp_path / "bomb.parquet"
    pq.write_table(pa.Table.from_pylist([{"question": "y" * (2 << 20), "answer": "#### 1"}]), bomb, compression="zstd")
    assert bomb.stat().st_size < 64 << 10  # small on disk, 2 MiB inside
    with pytest.raises(
        ValueError,
        match=r"`data.train_path`: .*bomb.parquet holds [\d,]+ bytes of records uncompressed, more than vaco reads \(1,048,576\)",
    ):
        read_gsm8k(str(bomb), "data.train_path")
