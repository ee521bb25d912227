"""Envs, the policy-version buffer, the rollout collector and the data module."""

from vaco.data.module import RolloutDataModule

__all__ = ["RolloutDataModule"]
