"""A finished run for the report's tests, built from its coordinates and metric histories
(the report's math is checked on such runs against float64 loops written in each test)."""

from __future__ import annotations

from vaco.report import Run


def make_run(
    algorithm: str,
    env: str,
    K: int,
    seed: int,
    histories: dict,
    *,
    run_id: str | None = None,
    name: str | None = None,
    axes: dict | None = None,
    realign: bool = False,
    objective: str = "PPOClip",
    **fields,
) -> Run:
    """A FINISHED :class:`~vaco.report.Run`; its id and name default to its coordinates, and
    ``fields`` (``fraction_metric``, ``variant_of``, ...) pass through."""
    return Run(
        run_id=run_id or f"{algorithm}-{env}-{K}-{seed}",
        name=name or f"{algorithm}-{env}-K{K}-s{seed}",
        status="FINISHED",
        algorithm=algorithm,
        env=env,
        K=K,
        seed=seed,
        axes=dict(axes or {}),
        realign=realign,
        objective=objective,
        histories=histories,
        **fields,
    )
