"""Policy objectives: one base class (:class:`Objective`), one surrogate per subclass."""

from vaco.objectives import objective_math
from vaco.objectives.base import Objective
from vaco.objectives.clip import PPOClip
from vaco.objectives.impala import IMPALA
from vaco.objectives.kl import PPOKL
from vaco.objectives.spo import SPO
from vaco.objectives.tv_filter import SequenceTVFilter, TVFilter

__all__ = ["objective_math", "Objective", "PPOClip", "PPOKL", "SPO", "IMPALA", "TVFilter", "SequenceTVFilter"]
