"""Helpers the tests import (``from helpers.runs import build_run``); pytest puts ``tests/`` on the
import path (``pythonpath`` in pyproject.toml). Fixtures stay in ``tests/conftest.py``.

* :mod:`helpers.runs`: a tiny real (module, data module, trainer), ``vaco`` as a subprocess, metric histories;
* :mod:`helpers.actors`: a filled policy buffer and a tiny run with actor processes;
* :mod:`helpers.tiny_sweep`: the tiny sweep several test files share (made once per session);
* :mod:`helpers.mlflow_server`: a real ``mlflow server`` on a free port;
* :mod:`helpers.services`: a one-node SLURM cluster and a PostgreSQL server, started once per session.
"""
