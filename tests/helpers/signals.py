"""A Lightning callback that sends this process a signal before a given optimiser step: a
preemption at a chosen point, for tests (``--trainer.callbacks+=helpers.signals.SignalAtStep``)."""

from __future__ import annotations

import os
import signal

from lightning.pytorch.callbacks import Callback


class SignalAtStep(Callback):
    """Send ``signum`` (default SIGTERM) to this process just before optimiser step ``step`` (1-based)."""

    def __init__(self, step: int, signum: int = int(signal.SIGTERM)) -> None:
        self.step, self.signum, self.seen = step, signum, 0

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        self.seen += 1
        if self.seen == self.step:
            os.kill(os.getpid(), self.signum)


class SignalAtBatchStart(Callback):
    """Send ``signum`` (default SIGTERM) to this process as training batch ``batch`` (1-based) starts,
    before its ``training_step`` generates anything: the LLM track's stop inside generation."""

    def __init__(self, batch: int, signum: int = int(signal.SIGTERM)) -> None:
        self.batch, self.signum, self.seen = batch, signum, 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.seen += 1
        if self.seen == self.batch:
            os.kill(os.getpid(), self.signum)


class SignalAtFirstEvaluation(Callback):
    """Send ``signum`` (default SIGTERM) to this process as the learner's first evaluation starts
    (the LLM track evaluates in its ``on_fit_start``, after every callback's): the evaluation then
    runs as it would, with the signal arrived."""

    def __init__(self, signum: int = int(signal.SIGTERM)) -> None:
        self.signum = signum

    def on_fit_start(self, trainer, pl_module) -> None:
        evaluate = pl_module.evaluate

        def signalled(*args, **kwargs):
            pl_module.evaluate = evaluate  # once
            os.kill(os.getpid(), self.signum)
            return evaluate(*args, **kwargs)

        pl_module.evaluate = signalled
