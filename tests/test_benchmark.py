"""The throughput benchmark's own logic: the targets it reports and the update-alone measurement.

CI times nothing, so these check what would make the benchmark report a wrong figure: a target
computed from the wrong pair or judged the wrong way, and an "update phase alone" run that
collected more than once (its samples/s would then include collection) or served a batch that is
not the one collected. The ratios are computed here independently, from numbers the test chooses.
"""

from __future__ import annotations

import sys

import torch

from helpers.runs import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import throughput  # noqa: E402


def _results(**changes: float) -> dict:
    r = {}
    for i, env_id in enumerate(("Hopper-v5", "HalfCheetah-v5")):
        r[f"ceiling/{env_id}/64"] = 10_000.0 + i
        r[f"collect/{env_id}/64/K1"] = 9_000.0 - 2_000 * i  # Hopper 0.9 of its ceiling (met), HalfCheetah 0.7 (missed)
        r[f"collect/{env_id}/64/K16"] = 8_500.0 - 2_000 * i
    for batch in ("1x2048", "64x128"):
        r[f"update/{batch}/ppo_clip"] = 1_000.0
        r[f"update/{batch}/vaco"] = 950.0  # VACO's update 1.053x PPO-clip's cost: met (<= 1.1)
        r[f"update/{batch}/impala"] = 400.0
    r["e2e/1x2048/vaco_ppo_clip"], r["e2e/1x2048/cleanrl"] = 1_200.0, 1_000.0
    r["e2e/64x128/vaco_ppo_clip"], r["e2e/64x128/vaco_ppo_clip_2workers"] = 3_000.0, 5_000.0
    r["e2e/64x128/cleanrl"] = 2_000.0
    r["memory/paper_batch_peak_rss_mib"] = 5_120.0  # 5 GiB: missed (<= 4)
    r.update(changes)
    return r


def test_each_target_is_its_ratio_judged_the_right_way():
    r = _results()
    got = throughput.targets(r, "1x2048", "64x128")
    expect = {
        "collection 64 envs / gymnasium ceiling (Hopper-v5)": (9_000 / 10_000, True),
        "collection 64 envs / gymnasium ceiling (HalfCheetah-v5)": (7_000 / 10_001, False),
        "collection K=16 / K=1 (Hopper-v5, 64 envs)": (8_500 / 9_000, True),
        "collection K=16 / K=1 (HalfCheetah-v5, 64 envs)": (6_500 / 7_000, True),
        "VACO update cost / PPO-clip (1x2048)": (1_000 / 950, True),
        "VACO update cost / PPO-clip (64x128)": (1_000 / 950, True),
        "IMPALA update cost / VACO (1x2048) [reported]": (950 / 400, True),
        "IMPALA update cost / VACO (64x128) [reported]": (950 / 400, True),
        "end-to-end vaco / CleanRL (1x2048)": (1.2, True),
        "end-to-end vaco / CleanRL (64x128)": (2.5, True),  # the better of one process and two workers
        "paper-scale batch peak RSS (GiB)": (5.0, False),
    }
    assert set(got) == set(expect)
    for name, (ratio, met) in expect.items():
        assert abs(got[name]["ratio"] - ratio) < 1e-12, name
        assert got[name]["met"] is met, name
    # a cost target is an upper bound: VACO's update at 1.25x PPO-clip's cost misses it
    slow = throughput.targets(_results(**{"update/64x128/vaco": 800.0}), "1x2048", "64x128")
    assert slow["VACO update cost / PPO-clip (64x128)"]["met"] is False
    assert abs(slow["VACO update cost / PPO-clip (64x128)"]["ratio"] - 1.25) < 1e-12
    # one process alone at 1.5x CleanRL misses the 2x target
    r = _results()
    del r["e2e/64x128/vaco_ppo_clip_2workers"]
    assert throughput.targets(r, "1x2048", "64x128")["end-to-end vaco / CleanRL (64x128)"]["met"] is False
    # without a memory figure (--skip-memory) there is no memory target
    r = _results()
    del r["memory/paper_batch_peak_rss_mib"]
    assert "paper-scale batch peak RSS (GiB)" not in throughput.targets(r, "1x2048", "64x128")


def test_the_update_alone_collects_once_and_trains_on_that_batch(tmp_path):
    """ReplayData under a real fit: one collection, then that batch every iteration (what the update
    phase's samples/s divides by), each iteration its own copy, and one timed step per iteration."""
    import lightning as L

    from vaco import VacoModule
    from vaco.advantages import VTrace
    from vaco.objectives import TVFilter

    served = []

    class Recorded(throughput.ReplayData):  # ReplayData as it is, each batch it serves recorded
        def train_dataloader(self):
            for batch in super().train_dataloader():
                served.append(batch.clone())
                yield batch

    L.seed_everything(1, verbose=False)
    module = VacoModule(objective=TVFilter(delta=0.2), advantage=VTrace(), update_epochs=2, num_minibatches=2)
    data = Recorded(
        env_id="InvertedPendulum-v5",
        num_envs=2,
        num_steps=16,
        total_steps=2 * 16 * 4,
        eval_every=0,
        eval_episodes=1,
        eval_envs=1,
        seed=1,
    )
    timer = throughput.IterationTimer()
    throughput._trainer(str(tmp_path), timer).fit(module, data)
    assert data.collector.iteration == 1  # collected once
    assert len(served) == len(timer.seconds) == 4
    assert all(s > 0 for s in timer.seconds)
    first = served[0]
    for batch in served[1:]:
        for key in ("observation", "action", "behavior_log_prob", ("next", "reward")):
            assert torch.equal(batch[key], first[key]), key
    assert module.global_step == 4 * 2 * 2  # the update ran on every served batch


def test_the_decoding_benchmarks_rule_names_a_winner_only_past_the_margin_and_in_every_pair():
    """``benchmarks/llm_decoding.py``'s declared rule: a decoder wins a regime when its median time is
    at least 5% below the other's and it is faster in every alternating pair; else undecided. The
    pairs are ``(vaco seconds, transformers seconds)``; the ratio is transformers' median over vaco's."""
    import statistics

    import llm_decoding

    def judge(pairs):
        mine, theirs = statistics.median(p[0] for p in pairs), statistics.median(p[1] for p in pairs)
        return llm_decoding.decide(theirs / mine, pairs)

    assert llm_decoding.MARGIN == 0.05
    assert judge([(1.0, 1.4), (1.1, 1.5), (0.9, 1.3)]) == "vaco wins"
    assert judge([(1.4, 1.0), (1.5, 1.1), (1.3, 0.9)]) == "transformers wins"
    assert judge([(1.0, 1.4), (1.6, 1.5), (0.9, 1.3)]) == "undecided"  # one pair the other way
    assert judge([(1.0, 1.04), (1.0, 1.04), (1.0, 1.04)]) == "undecided"  # 4% faster: inside the margin
    # at the margin's edge, each side: transformers 5% below vaco wins; vaco 5% below transformers wins
    assert judge([(1.0, 0.95)] * 3) == "transformers wins" and judge([(1.0, 0.951)] * 3) == "undecided"
    assert judge([(0.95, 1.0)] * 3) == "vaco wins" and judge([(0.951, 1.0)] * 3) == "undecided"
