"""Advantage estimators: pure functions in :mod:`vaco.advantages.advantage_math`, thin modules here."""

from vaco.advantages import advantage_math
from vaco.advantages.modules import GAE, AdvantageModule, VTrace

__all__ = ["advantage_math", "AdvantageModule", "GAE", "VTrace"]
