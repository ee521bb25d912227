"""A minibatch of the LLM track in micro-batches: the helpers :class:`~vaco.llm.rlvr_module.RLVRModule`'s
update uses, and the lag diagnostics of the whole minibatch gathered across its micro-batches."""

from __future__ import annotations

from typing import Any

import torch

from vaco.learners.step_size import log_importance_weights
from vaco.objectives.objective_math import effective_sample_size, masked_quantile

__all__ = ["SEQUENCE_KEYS", "LagTally", "batch_metrics", "to_device", "trim"]


class LagTally:
    """The lag diagnostics of a minibatch trained in micro-batches: the ESS of the ratios and of the
    weights the objective applies, and the ratio's 99th percentile and maximum, over every valid token of
    the minibatch (a token-weighted mean of the micro-batches' own values is not any of them)."""

    def __init__(self, objective) -> None:
        self.objective = objective
        self.ratios: list[torch.Tensor] = []
        self.applied: list[torch.Tensor] = []

    def add(self, log_ratio: torch.Tensor, inputs: dict[str, torch.Tensor]) -> None:
        """One micro-batch: its detached log ratios and the objective's inputs (their ``mask``)."""
        mask = inputs["mask"]
        self.ratios.append(log_importance_weights(log_ratio, mask, "token").exp())
        weight = self.objective.applied_weight(log_ratio, inputs)
        if weight is not None:
            self.applied.append(weight[mask.bool()])

    def finish(self) -> dict[str, torch.Tensor]:
        every = torch.cat(self.ratios)
        ess = effective_sample_size(every)
        return {
            "ess": ess,
            "ess_applied": effective_sample_size(torch.cat(self.applied)) if self.applied else ess,
            "ratio_p99": masked_quantile(every, 0.99),
            "ratio_max": every.max(),
        }


def batch_metrics(batch, version: int, num_minibatches: int, episodes_per_step: int) -> dict[str, float]:
    """Generation batch ``version``'s metrics (a :class:`~vaco.llm.stopped.StoppedBatch`), logged at its
    last minibatch's step; ``episodes_per_step``: the completions a minibatch holds."""
    minibatches, tvs = batch.minibatches, batch.tvs
    steps = version * num_minibatches
    rewards = torch.cat([m["reward"].reshape(-1) for m in minibatches])
    groups = torch.cat([m["reward"] for m in minibatches])
    lengths = torch.cat([m["completion_mask"].sum(-1) for m in minibatches]).float()
    tokens = float(lengths.sum())
    seconds = batch.generate_seconds + batch.update_seconds
    return {
        "train/reward": float(rewards.mean()),
        "train/mixed_groups": float((groups.max(-1).values != groups.min(-1).values).float().mean()),
        "train/completion_length": float(lengths.mean()),
        "train/truncated_fraction": float(torch.cat([m["truncated"] for m in minibatches]).float().mean()),
        "train/prompt_truncated": float(sum(m["prompt_truncated"] for m in minibatches)),
        "lag/forward_tv": tvs[-1],
        **(
            {"lag/rescore_tv": float(torch.stack([m["rescore_tv"] for m in minibatches]).mean())}
            if minibatches[0]["rescore_tv"] is not None
            else {}
        ),
        "lag/forward_tv_mean": sum(tvs) / len(tvs),
        "perf/generate_seconds": batch.generate_seconds,
        "perf/update_seconds": batch.update_seconds,
        "perf/tokens_per_second": tokens / max(seconds, 1e-9),
        "time/generation_batch": version,
        "time/episodes": steps * episodes_per_step,
    }


def to_device(minibatch: dict[str, Any], device) -> dict[str, Any]:
    """A minibatch's tensors on ``device`` (its plain values as they are)."""
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in minibatch.items()}


SEQUENCE_KEYS = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "behavior_log_prob", "advantage")


def trim(part: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Drop the prompt columns that are padding in every row, and the completion columns likewise."""
    prompt_start = int(part["prompt_mask"].any(0).long().argmax())
    completion_end = max(1, int(part["completion_mask"].any(0).sum()))
    out = dict(part)
    out["prompt_ids"], out["prompt_mask"] = part["prompt_ids"][:, prompt_start:], part["prompt_mask"][:, prompt_start:]
    for key in ("completion_ids", "completion_mask", "behavior_log_prob", "advantage"):
        if key in part:
            out[key] = part[key][:, :completion_end]
    return out
