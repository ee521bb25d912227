"""A small byte-level BPE tokenizer trained here on the synthetic corpus (no model hub needed).

Words (with their leading space) merge into single tokens; every digit stays its own token, as
in Qwen2.5 and Llama 3, so numbers are spelled digit by digit. Byte level: any text encodes.
The result is a ``transformers`` fast tokenizer, saved and loaded like any other
(``save_pretrained`` / ``AutoTokenizer.from_pretrained``).
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

__all__ = ["EOS_TOKEN", "PAD_TOKEN", "train_tokenizer"]

EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"
# a word with its leading space, one digit (with its leading space), a run of punctuation, whitespace
_PIECES = Regex(r" ?[A-Za-z]+| ?[0-9]| ?[^\sA-Za-z0-9]+|\s+")


def train_tokenizer(texts: Iterable[str], vocab_size: int = 512) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE of ``vocab_size`` tokens (256 bytes + merges + 2 specials) on ``texts``."""
    if not (isinstance(vocab_size, int) and vocab_size > 258):
        raise ValueError(f"`vocab_size` must be an integer > 258 (256 bytes + 2 special tokens), got {vocab_size!r}")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(_PIECES, behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN, PAD_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=EOS_TOKEN, pad_token=PAD_TOKEN)
