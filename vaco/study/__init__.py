"""The study protocol: a plan declared before the runs, the rule that judges it, the record of its looks.

:mod:`~vaco.study.plan` (the plan a sweep file declares, its group-sequential boundaries and
Holm's step-down over looks), :mod:`~vaco.study.judge` (a plan judged at a look from the runs,
and every reading recorded on the sweep's parent run), :mod:`~vaco.study.looks` (which
cells a look runs, and a look judged), :mod:`~vaco.study.randomisation` (the
exact randomisation test a plan may declare), :mod:`~vaco.study.sizing` (a plan's size and power
simulated from a pilot). The statistics a study reads (drops, differences of drops, IQMs) are the
report's (:mod:`vaco.report.robustness`); ``vaco sweep --until-decided`` runs the looks.
"""
