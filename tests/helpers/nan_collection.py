"""A collection backend for tests: gymnasium in process, except that the run seeded ``seed`` gets a
NaN observation in its batch of iteration ``iteration`` (1-based), so that its loss turns non-finite
there. Used to stop one member of a population (tests/test_population_fit.py)."""

from __future__ import annotations

from vaco.data.collection import InProcess


class NaNAt(InProcess):
    def __init__(self, seed: int = 7, iteration: int = 2) -> None:
        self.seed, self.iteration = seed, iteration

    def collector(self, data, seed: int, env=None):
        collector = super().collector(data, seed, env)
        if data.seed == self.seed:
            end_rollout = collector.end_rollout

            def with_nan(segment):
                batch = end_rollout(segment)
                if collector.iteration == self.iteration:
                    batch["observation"][0, 0, 0] = float("nan")
                return batch

            collector.end_rollout = with_nan  # a solo rollout and a population's lockstep both end there
        return collector
