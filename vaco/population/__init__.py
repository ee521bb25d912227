"""``vaco fit --population``: S seeds of one config trained as one computation, each member bit for bit its solo run.

The member dimension lives here, and only here: :mod:`~vaco.population.module` (``PopulationModule``,
the learner holding the members, and ``PopulationDataModule``, their data), :mod:`~vaco.population.layout`
(``PopulationUpdate``: the update of all members at once, the population's layout of the one update
loop in :mod:`vaco.learners.update`) and :mod:`~vaco.population.lockstep` (``Lockstep``: the members' envs as
blocks of one simulator, stepped and recorded at once).
"""
