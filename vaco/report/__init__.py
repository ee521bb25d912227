"""``vaco report``: MLflow runs -> normalised scores -> rliable aggregates, PNG figures, a Markdown summary.

The package is the workflow: :mod:`~vaco.report.runs` (read runs from MLflow or a data file),
:mod:`~vaco.report.scores` (statistics as data), :mod:`~vaco.report.tables` (the aggregate tables), :mod:`~vaco.report.robustness` (each algorithm's
drop from its own K = 1), :mod:`~vaco.report.ranking` (the algorithms ordered by it), :mod:`~vaco.report.sensitivity` (those verdicts under every scoring),
:mod:`~vaco.report.design` (the 2x2 step-size design's contrasts), :mod:`~vaco.report.figures` (drawn from them),
:mod:`~vaco.report.summary` (``summary.md``), :mod:`~vaco.report.page` (``benchmark.html``). The command,
``vaco report``, is :mod:`vaco.commands.report` (its docstring, printed by ``vaco report --help``, states
the protocol): it composes this package and the study plan's verdicts (:mod:`vaco.study`), which sit
above it. Everything here is importable from ``vaco.report`` too (``from vaco import report as R``).
"""

# every module's public names, as listed in its own __all__ (one list to keep, not two)
import vaco.report.ablations as _ablations
import vaco.report.decision as _decision
import vaco.report.design as _design
import vaco.report.figures as _figures
import vaco.report.page as _page
import vaco.report.ranking as _ranking
import vaco.report.robustness as _robustness
import vaco.report.robustness_summary as _robustness_summary
import vaco.report.runs as _runs
import vaco.report.scores as _scores
import vaco.report.sensitivity as _sensitivity
import vaco.report.summary as _summary
import vaco.report.tables as _tables
from vaco.report.ablations import *  # noqa: F403
from vaco.report.decision import *  # noqa: F403
from vaco.report.design import *  # noqa: F403
from vaco.report.figures import *  # noqa: F403
from vaco.report.page import *  # noqa: F403
from vaco.report.ranking import *  # noqa: F403
from vaco.report.robustness import *  # noqa: F403
from vaco.report.robustness_summary import *  # noqa: F403
from vaco.report.runs import *  # noqa: F403
from vaco.report.scores import *  # noqa: F403
from vaco.report.sensitivity import *  # noqa: F403
from vaco.report.summary import *  # noqa: F403
from vaco.report.tables import *  # noqa: F403

__all__ = sorted(
    {
        *_ablations.__all__,
        *_decision.__all__,
        *_design.__all__,
        *_figures.__all__,
        *_page.__all__,
        *_ranking.__all__,
        *_robustness.__all__,
        *_robustness_summary.__all__,
        *_runs.__all__,
        *_scores.__all__,
        *_sensitivity.__all__,
        *_summary.__all__,
        *_tables.__all__,
    }
)
