# Entry points (README): `make main` runs the notebook series, `make test` runs the test suite,
# `make lab` opens the notebooks in JupyterLab. Each creates the virtual environment .venv on first
# use (Python 3.11+ required).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
ARGS   ?=
# pytest workers (pytest-xdist): the simulator is CPU-bound, one worker a core
JOBS   ?= auto
TORCH_PIP_ARGS ?=
# extra arguments of `jupyter lab`, e.g. LAB_ARGS="--no-browser --port 8890"
LAB_ARGS ?=

.PHONY: main test test-slow test-browser install-browser lab data clean-build

# MovieLens-100K first (once), so its download shows here rather than inside notebook 01's output
main: $(STAMP)
	@$(PY) -m andromeda_nb data > /dev/null
	$(PY) -m andromeda_nb run $(ARGS)

# JupyterLab on .venv (its kernel: the project's Python), the file browser in notebooks/. A notebook's
# kernel starts in notebooks/ and moves to the repository root, where `make main` runs it.
lab: $(STAMP)
	$(VENV)/bin/jupyter lab --ServerApp.root_dir="$(CURDIR)" --LabApp.default_url=/lab/tree/notebooks \
	  $$([ "$$(id -u)" = 0 ] && echo --allow-root) $(LAB_ARGS)

# the default tier (~5-9 minutes on 2 cores: its target is ~6); test-slow runs the long simulator
# tests (marked slow) and the notebook series under the smoke parameters (marked notebook)
test: $(STAMP)
	NUMBA_ENABLE_CUDASIM=1 OPENBLAS_NUM_THREADS=1 $(PY) -m pytest -n $(JOBS) -rs -m "not slow and not notebook and not browser" $(ARGS)

test-slow: $(STAMP)
	NUMBA_ENABLE_CUDASIM=1 OPENBLAS_NUM_THREADS=1 $(PY) -m pytest -n $(JOBS) -m "(slow or notebook) and not browser" $(ARGS)

# the browser tier: JupyterLab in headless Chromium (one server, so no workers); screenshots in
# build/browser/. Skipped without chromium and chromedriver, a failure with CI=true.
test-browser: $(STAMP)
	NUMBA_ENABLE_CUDASIM=1 OPENBLAS_NUM_THREADS=1 $(PY) -m pytest -n 0 -m browser tests/browser $(ARGS)

# Debian's chromium and chromium-driver (/usr/bin/chromium, /usr/bin/chromedriver) for test-browser;
# as root, or through sudo. Nothing else is downloaded: Selenium is given both paths.
install-browser:
	@if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then \
	  echo "chromium and chromedriver: installed"; \
	else \
	  SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium chromium-driver; \
	fi

data: $(STAMP)
	$(PY) -m andromeda_nb data

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "andromeda-nb needs Python 3.11 or newer; set PYTHON=/path/to/python3.11")'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	@# PyTorch (training notebooks). Where pip finds a local CPU wheel of 2.13.0 (the development
	@# machines) that is what installs; from plain PyPI on Linux this pin is the multi-GB CUDA build:
	@# set TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu" for the CPU build
	$(PY) -m pip install --quiet $(TORCH_PIP_ARGS) 'torch==2.13.0'
	$(PY) -m pip install --quiet -e '.[test,train]'
	@# the notebooks' kernel (python3) registered in .venv, pinned to its Python: a python3 kernel
	@# of another install in ~/.local/share/jupyter cannot take its place
	$(PY) -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (andromeda-nb)"
	touch $(STAMP)

clean-build:
	rm -rf build
