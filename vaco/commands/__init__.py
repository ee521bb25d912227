"""The commands that are one or two files each: the ``vaco`` dispatcher and the commands it starts.

:mod:`~vaco.commands.cli` (``vaco``: dispatch only, imports nothing heavy), :mod:`~vaco.commands.fit`
(``vaco fit``: LightningCLI and its defaults) with :mod:`~vaco.commands.fit_checks` (the checks
before any work), :mod:`~vaco.commands.evaluate` (``vaco evaluate``) and :mod:`~vaco.commands.ui`
(``vaco ui``) with :mod:`~vaco.commands.ui_app` (MLflow's app with vaco's default view). The
commands with rooms of their own are :mod:`vaco.sweep` and :mod:`vaco.report`.
"""
