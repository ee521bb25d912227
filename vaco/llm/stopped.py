"""What an LLM run keeps of a generation batch a stop (SIGTERM, SIGUSR2, Ctrl-C) interrupted, in
its checkpoint, so that the resume neither repeats nor skips a step of it
(:meth:`vaco.llm.rlvr_module.RLVRModule.training_step`)."""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["StoppedBatch"]


@dataclasses.dataclass
class StoppedBatch:
    """A generation batch in training, and what a checkpoint keeps of one a stop interrupted: its
    stream index alone (``regenerate``: stopped during generation, the resume generates it again),
    or its minibatches with the next one to train, the minibatches' TVs so far and its timings
    (stopped between two minibatches)."""

    regenerate: int | None = None
    minibatches: list[dict[str, Any]] | None = None
    next: int = 0
    tvs: list[float] = dataclasses.field(default_factory=list)
    generate_seconds: float = 0.0
    update_seconds: float = 0.0

    def state(self) -> dict[str, Any]:
        """The checkpoint's plain form (tensors, numbers and lists only)."""
        if self.minibatches is None:
            return {"regenerate": self.regenerate}
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "regenerate"}

    @classmethod
    def from_state(cls, state: dict[str, Any] | None) -> StoppedBatch | None:
        return None if state is None else cls(**state)
