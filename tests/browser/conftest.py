"""The browser tier's fixtures: a JupyterLab server on localhost and headless Chromium driving it.

JupyterLab runs on this environment's Python (as `make lab` does) in a throwaway folder laid out
like the repository: ``notebooks/`` holds the notebooks under test with the smoke preset's sizes
injected the way a batch run injects them, ``data/`` links to the repository's data (MovieLens is
fetched into the repository's ``data/ml-100k`` on first use, as `make main` does), and ``figures/``
starts empty. Selenium drives Debian's ``chromium`` through its ``chromedriver``; both paths are
given, so nothing is downloaded. Without selenium, chromium or chromedriver the tier is skipped,
and with ``CI=true`` it fails instead.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import nbformat
import pytest

from andromeda_nb.runner.series import RUNNER_KEYS, plan_series

REPO = Path(__file__).resolve().parents[2]
#: Where the screenshots go (build/ is not committed).
SCREENSHOTS = REPO / "build" / "browser"
#: The notebooks opened in the browser: the quickstart and a figure-making notebook.
NOTEBOOKS = ("01_quickstart", "02_scoring")
INSTALL_HINT = ("run `make install-browser` (Debian's chromium and chromium-driver) and "
                "`pip install -e '.[test]'` (selenium)")
SERVER_START_S = 180
CI = os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def missing(what: str):
    """Skip the test for want of ``what``; with CI=true fail it."""
    message = f"the browser tier needs {what}: {INSTALL_HINT}"
    if CI:
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


@dataclass(frozen=True)
class Lab:
    """A running JupyterLab: its base URL, token, the folder it serves and its log."""

    url: str
    token: str
    root: Path
    log: Path

    def log_tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _repository_copy(root: Path) -> Path:
    """The folder JupyterLab serves: notebooks/ (smoke sizes injected), data/ linked, no figures/."""
    (root / "notebooks").mkdir(parents=True)
    (root / "data").mkdir()
    (root / "data" / "results").symlink_to(REPO / "data" / "results")
    (REPO / "data" / "ml-100k").mkdir(exist_ok=True)
    (root / "data" / "ml-100k").symlink_to(REPO / "data" / "ml-100k")
    from papermill.iorw import load_notebook_node
    from papermill.parameterize import parameterize_notebook

    for item in plan_series(notebooks_dir=REPO / "notebooks", params="smoke", only=list(NOTEBOOKS)):
        # the preset's sizes, but the notebook's own figures_dir and metrics_dir: relative paths
        # resolve against the kernel's working directory, which check_parameters moves to root
        parameters = {k: v for k, v in item.parameters.items() if k not in RUNNER_KEYS}
        nb = load_notebook_node(str(item.source))
        if parameters:
            nb = parameterize_notebook(nb, parameters)
        nbformat.write(nb, str(root / "notebooks" / item.source.name))
    # JupyterLab's own settings for this server: no news or update toasts over the notebooks
    notification = root.parent / "settings" / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    notification.parent.mkdir(parents=True)
    notification.write_text(json.dumps({"fetchNews": "false", "checkForUpdates": False}))
    return root


@pytest.fixture(scope="session")
def lab(tmp_path_factory):
    """JupyterLab serving the repository copy on 127.0.0.1, kernels on the CUDA simulator."""
    base = tmp_path_factory.mktemp("lab")
    root = _repository_copy(base / "repo")
    port, token = _free_port(), secrets.token_hex(16)
    cmd = [
        sys.executable, "-m", "jupyterlab", "--no-browser",
        f"--ServerApp.root_dir={root}", "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}",
        "--LabApp.default_url=/lab/tree/notebooks",  # as `make lab`
        "--LabApp.expose_app_in_browser=True",  # window.jupyterapp: the test reads the notebook's model
        f"--LabApp.user_settings_dir={base / 'settings'}", f"--LabApp.workspaces_dir={base / 'workspaces'}",
    ]
    if os.geteuid() == 0:
        cmd.append("--allow-root")
    env = {
        **os.environ,
        "NUMBA_ENABLE_CUDASIM": "1",
        "OPENBLAS_NUM_THREADS": "1",
        # the kernels import the package under test, whatever checkout the environment installed
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        "JUPYTER_CONFIG_DIR": str(base / "config"),
        "JUPYTER_RUNTIME_DIR": str(base / "runtime"),
    }
    log = base / "jupyterlab.log"
    url = f"http://127.0.0.1:{port}"
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT)
    server = Lab(url, token, root, log)
    try:
        deadline = time.monotonic() + SERVER_START_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"JupyterLab exited with {proc.returncode}:\n{server.log_tail()}", pytrace=False)
            try:
                with urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=5) as reply:
                    if reply.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"JupyterLab did not answer in {SERVER_START_S} s:\n{server.log_tail()}", pytrace=False)
            time.sleep(0.5)
        yield server
    finally:
        try:  # a clean stop shuts its kernels down too
            request = urllib.request.Request(f"{url}/api/shutdown", method="POST",
                                             headers={"Authorization": f"token {token}"})
            urllib.request.urlopen(request, timeout=10).close()
            proc.wait(timeout=30)
        except (urllib.error.URLError, OSError, subprocess.TimeoutExpired):
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture(scope="session")
def browser(tmp_path_factory):
    """Headless Chromium from the system packages, driven through the system chromedriver."""
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        missing("selenium")
    chromium = next(filter(None, map(shutil.which, ("chromium", "chromium-browser"))), None)
    if chromium is None:
        missing("chromium")
    chromedriver = shutil.which("chromedriver")
    if chromedriver is None:
        missing("chromedriver")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--disable-dev-shm-usage", "--window-size=1500,1100",
                f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}"):
        options.add_argument(arg)
    if os.geteuid() == 0:
        options.add_argument("--no-sandbox")  # Chromium's sandbox refuses to run as root
    driver = webdriver.Chrome(service=Service(executable_path=chromedriver), options=options)
    driver.set_script_timeout(30)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    for old in SCREENSHOTS.glob("*.png"):
        old.unlink()
    try:
        yield driver
    finally:
        driver.quit()
