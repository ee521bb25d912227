"""The learner contract and the MuJoCo learner.

:mod:`~vaco.learners.learner` (``Learner``: what ``vaco fit`` trains, and what every learner shares),
:mod:`~vaco.learners.vaco_module` (``VacoModule``: Algorithm 1), :mod:`~vaco.learners.update`
(the one epochs x minibatches update loop, and a run's layout of it), :mod:`~vaco.learners.networks`
(the actor and the critic) and :mod:`~vaco.learners.proximal` (the EWMA proximal policy). The
population's learner is :mod:`vaco.population`, the LLM track's :mod:`vaco.llm.rlvr_module`.
"""
