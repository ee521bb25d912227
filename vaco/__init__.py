"""vaco: asynchronous on-policy RL with advantage realignment and TV filtering.

Honari et al., "Align and Filter: Improving Performance in Asynchronous On-Policy RL",
arXiv:2603.01365, 2026.

``vaco.VacoModule`` and ``vaco.data.RolloutDataModule`` are the MuJoCo training pair;
``vaco.advantages`` and ``vaco.objectives`` hold the math.
"""

__version__ = "0.1.0"

__all__ = ["VacoModule", "RolloutDataModule"]


def __getattr__(name):  # lazy: `import vaco.objectives` must not pull in Lightning and MuJoCo
    if name == "VacoModule":
        from vaco.learners.vaco_module import VacoModule

        return VacoModule
    if name == "RolloutDataModule":
        from vaco.data.datamodule import RolloutDataModule

        return RolloutDataModule
    raise AttributeError(f"module 'vaco' has no attribute {name!r}")
