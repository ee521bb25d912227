"""Policy objectives: one base class (:class:`Objective`), one surrogate per subclass."""

from vaco.objectives import objective_math
from vaco.objectives.appo import APPO
from vaco.objectives.base import Objective, metric_name
from vaco.objectives.cispo import CISPO
from vaco.objectives.clip import PPOClip
from vaco.objectives.decoupled import DecoupledPPO
from vaco.objectives.dppo_tv import DPPOTV, KimiK25
from vaco.objectives.gspo import GSPO
from vaco.objectives.impala import IMPALA
from vaco.objectives.importance import MIS, TIS, SequenceMIS, SequenceTIS
from vaco.objectives.kl import PPOKL
from vaco.objectives.m2po import M2PO
from vaco.objectives.off_policy_mask import OffPolicySequenceMask
from vaco.objectives.ppo_ewma import PPOEWMA
from vaco.objectives.rho_correction import OpenInstructRho
from vaco.objectives.spo import SPO
from vaco.objectives.topr import TOPR
from vaco.objectives.tv_filter import SequenceTVFilter, TVFilter

__all__ = [
    "objective_math",
    "metric_name",
    "Objective",
    "PPOClip",
    "PPOKL",
    "SPO",
    "IMPALA",
    "TVFilter",
    "SequenceTVFilter",
    "DecoupledPPO",
    "PPOEWMA",
    "TIS",
    "MIS",
    "SequenceTIS",
    "SequenceMIS",
    "CISPO",
    "DPPOTV",
    "APPO",
    "GSPO",
    "OpenInstructRho",
    "M2PO",
    "TOPR",
    "OffPolicySequenceMask",
    "KimiK25",
]
