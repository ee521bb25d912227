"""Envs, the policy-version buffer, the rollout collector and the data module."""

__all__ = ["RolloutDataModule", "Collection", "InProcess"]


def __getattr__(name):
    # lazy, so that actor processes (which import vaco.data.parallel.actors) do not pay for Lightning
    if name == "RolloutDataModule":
        from vaco.data.datamodule import RolloutDataModule

        return RolloutDataModule
    if name in ("Collection", "InProcess"):  # the collection backends (vaco.data.warp.Warp is another)
        from vaco.data import collection

        return getattr(collection, name)
    raise AttributeError(f"module 'vaco.data' has no attribute {name!r}")
