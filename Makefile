# Two entry points (README): `make main` runs the notebook series, `make test` runs the test suite.
# Both create the virtual environment .venv on first use (Python 3.11+ required).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
ARGS   ?=
# pytest workers (pytest-xdist): the simulator is CPU-bound, one worker a core
JOBS   ?= auto
TORCH_PIP_ARGS ?=

.PHONY: main test test-slow data clean-build

main: $(STAMP)
	$(PY) -m andromeda_nb run $(ARGS)

# the default tier (under ~6 minutes on 2 cores); test-slow runs the long simulator tests (marked slow)
test: $(STAMP)
	NUMBA_ENABLE_CUDASIM=1 OPENBLAS_NUM_THREADS=1 $(PY) -m pytest -n $(JOBS) -m "not slow" $(ARGS)

test-slow: $(STAMP)
	NUMBA_ENABLE_CUDASIM=1 OPENBLAS_NUM_THREADS=1 $(PY) -m pytest -n $(JOBS) -m slow $(ARGS)

data: $(STAMP)
	$(PY) -m andromeda_nb data

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "andromeda-nb needs Python 3.11 or newer; set PYTHON=/path/to/python3.11")'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# PyTorch (training notebooks). Where pip finds a local CPU wheel of 2.13.0 (the development
	# machines) that is what installs; from plain PyPI on Linux this pin is the multi-GB CUDA build:
	# set TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu" for the CPU build
	$(PY) -m pip install --quiet $(TORCH_PIP_ARGS) 'torch==2.13.0'
	$(PY) -m pip install --quiet -e '.[test,train]'
	touch $(STAMP)

clean-build:
	rm -rf build
