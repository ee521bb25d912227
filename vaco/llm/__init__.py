"""RL for LLM reasoning (the paper's GSM8k experiment): GRPO vs VACO-GRPO under forward policy lag.

``vaco.llm.RLVRModule`` and ``vaco.llm.GSM8kDataModule`` are the training pair for ``vaco fit``
(configs under ``configs/llm/``); :mod:`vaco.llm.reward` is the verifiable reward,
:mod:`vaco.llm.synthetic` and :mod:`vaco.llm.sft` build the CPU setting. See ``docs/llm.md``.
"""

from vaco.llm.reward import gsm8k_reward  # light: no transformers, no Lightning

__all__ = ["RLVRModule", "GSM8kDataModule", "GroupRelative", "gsm8k_reward"]


def __getattr__(name):  # lazy: the reward parser must not pull in transformers and Lightning
    if name == "RLVRModule":
        from vaco.llm.rlvr_module import RLVRModule

        return RLVRModule
    if name == "GSM8kDataModule":
        from vaco.llm.data import GSM8kDataModule

        return GSM8kDataModule
    if name == "GroupRelative":
        from vaco.llm.advantage import GroupRelative

        return GroupRelative
    raise AttributeError(f"module 'vaco.llm' has no attribute {name!r}")
