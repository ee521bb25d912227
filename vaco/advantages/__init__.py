"""Advantage estimators: pure functions in :mod:`vaco.advantages.functional`, thin modules here."""

from vaco.advantages import functional
from vaco.advantages.modules import GAE, AdvantageModule, VTrace

__all__ = ["functional", "AdvantageModule", "GAE", "VTrace"]
