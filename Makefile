# vaco: the two commands a user needs are `make demo` and `make test`.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
# `make demo` needs none of the extras: the core package alone (torch, Lightning, TorchRL, gymnasium's
# MuJoCo, MLflow, rliable); `make test` and the other targets install every extra on top of it
BASE    := $(VENV)/.installed-core
# torch must come first: the pinned CPU wheel is on disk; an unpinned torch pulls GBs of CUDA.
TORCH   := torch==2.13.0
EXTRAS  ?= test,llm,video,slurm,ray,warp,postgres,envpool
# Each CI/test process gets one torch thread; env stepping and the learner share two cores.
export OMP_NUM_THREADS ?= 1
export MKL_NUM_THREADS ?= 1
# the suite runs on two pytest-xdist workers (tests/conftest.py groups the tests); TEST_WORKERS=0 runs it in one process.
# `make test` ends with the 30 slowest tests (set-up, call, tear-down apart) and the seconds of each file and
# worker: where its ~25 minutes on two cores go (docs/performance.md); `make test-fast` (~3 minutes) leaves out
# the tests marked slow (3 s or more)
TEST_WORKERS ?= 2
PYTEST  := $(BIN)/python -m pytest -q $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadgroup)

.PHONY: help venv install test test-fast test-core check constraints demo bench notebook clean

help:
	@echo "make demo   - create .venv, install the core package, train VACO (K=4) on Hopper-v5 (measured times: README)"
	@echo "make test   - create .venv, install, run the test suite (~25 min on 2 cores)"
	@echo "make test-fast - the quick tier (~3 min): math, objectives, configs, learners; no test marked slow"
	@echo "make check  - ruff format --check and ruff check (what CI runs first)"
	@echo "make notebook - run notebooks/analysis.ipynb headless (e.g. VACO_DATA=docs/data/five_tasks.csv.gz make notebook)"
	@echo "make bench  - start-up times, throughput (writes benchmarks/results/throughput.json), the paper-scale update (CPU; and GPU where there is one), the Warp backend (docs/gpu.md)"

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip >/dev/null

# constraints.txt pins every package to the versions the tests passed with (`make constraints` refreshes it)
$(BASE): $(BIN)/python pyproject.toml constraints.txt
	$(BIN)/pip install "$(TORCH)"
	$(BIN)/pip install -c constraints.txt -e .
	touch $(BASE)

$(STAMP): $(BASE)
	$(BIN)/pip install -c constraints.txt -e ".[$(EXTRAS)]"
	touch $(STAMP)

venv install: $(STAMP)

test: $(STAMP)
	$(PYTEST) --durations=30 tests

# formatting and lint (ruff, configured in pyproject.toml); .ci/run runs it before the tests
check: $(STAMP)
	$(BIN)/ruff format --check vaco tests benchmarks scripts
	$(BIN)/ruff check vaco tests benchmarks scripts

# re-pin constraints.txt from a fresh install of pyproject.toml's dependencies (unconstrained)
constraints: $(BIN)/python
	$(BIN)/pip install "$(TORCH)"
	$(BIN)/pip install -e ".[$(EXTRAS)]"
	( echo "# Every package the tests passed with (make installs with -c constraints.txt), from a venv made by"; \
	  echo "# 'make install' on Python 3.11. Refresh after changing pyproject.toml's dependencies:"; \
	  echo "#   make constraints   (pip freeze --exclude-editable of a fresh .venv; torch's local tag dropped)"; \
	  $(BIN)/pip freeze --exclude-editable | grep -v '^vaco' | sed 's/^torch==\([0-9.]*\)+cpu$$/torch==\1/' ) > constraints.txt

test-fast: $(STAMP)
	$(PYTEST) -m "not slow" tests

demo: $(BASE)
	$(BIN)/vaco fit --config configs/demo.yaml

# the core install as a newcomer has it (no extras, its own .venv-core): every quickstart command of README.md
test-core:
	scripts/check_core_install.sh .venv-core

# the analysis notebook, headless, as Jupyter runs it (kernel in notebooks/); VACO_EXPERIMENT,
# MLFLOW_TRACKING_URI or VACO_DATA say what it reads (docs/sweeps.md); writes analysis-run.ipynb.
# Its input is checked on the core install first; only then are the notebook's three packages added
notebook: $(BASE)
	@$(BIN)/python scripts/notebook_inputs.py
	@$(BIN)/python -c "import nbclient, nbformat, ipykernel" 2>/dev/null || $(BIN)/pip install -q -c constraints.txt -e ".[notebook]"
	$(BIN)/python -c "import nbformat, nbclient; nb = nbformat.read('notebooks/analysis.ipynb', 4); \
	  nbclient.NotebookClient(nb, timeout=1800, kernel_name='python3', resources={'metadata': {'path': 'notebooks'}}).execute(); \
	  nbformat.write(nb, 'analysis-run.ipynb')"
	@echo "wrote analysis-run.ipynb"

bench: $(STAMP)
	$(BIN)/python benchmarks/startup.py
	$(BIN)/python benchmarks/throughput.py
	$(BIN)/python benchmarks/study_cell.py
	$(BIN)/python benchmarks/profile_update.py --algorithm vaco --num-envs 500 --num-steps 1000 --iterations 2 --no-profile --device cpu
	@if $(BIN)/python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then \
		$(BIN)/python benchmarks/profile_update.py --algorithm vaco --num-envs 500 --num-steps 1000 --iterations 2 --no-profile --device cuda; \
	else echo "no CUDA device: the paper-scale update was measured on the CPU only"; fi
	$(BIN)/python benchmarks/warp_throughput.py

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
