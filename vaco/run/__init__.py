"""What a run holds and writes around its learner, for any learner.

:mod:`~vaco.run.callbacks` (checkpoints counted in iterations, the progress bar, the log lines),
:mod:`~vaco.run.logger` (the MLflow logger that survives outages), :mod:`~vaco.run.checkpoint`
(atomic writes and safe reads), :mod:`~vaco.run.lock` (one process per run) and
:mod:`~vaco.run.rendezvous` (DDP's store on the loopback interface).
"""
