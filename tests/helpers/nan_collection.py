"""A collection backend for tests: gymnasium in process, except that the run seeded ``seed`` gets a
NaN observation in its batch of iteration ``iteration`` (1-based), so that its loss turns non-finite
there. Used to stop one member of a population (tests/test_population_fit.py)."""

from __future__ import annotations

from vaco.data.collection import InProcess
from vaco.data.collector import RolloutCollector


class _NaNCollector(RolloutCollector):
    def __init__(self, *args, nan_at: int, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.nan_at = nan_at

    def rollout(self):
        batch = super().rollout()
        if self.iteration == self.nan_at:
            batch["observation"][0, 0, 0] = float("nan")
        return batch


class NaNAt(InProcess):
    def __init__(self, seed: int = 7, iteration: int = 2) -> None:
        self.seed, self.iteration = seed, iteration

    def collector(self, data, seed: int):
        if data.seed != self.seed:
            return super().collector(data, seed)
        return _NaNCollector(
            data.env_id,
            data.num_envs,
            data.num_steps,
            None,
            data.num_iterations(),
            gamma=data.gamma,
            scale_reward=data.scale_reward,
            seed=seed,
            env_kwargs=data.env_kwargs,
            nan_at=self.iteration,
        )
