"""The commit a result row was measured at, as every results table records it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

#: where the experiments write their rows: changes there leave the code under test as committed
RESULTS_DIR = "data/results"
#: the committed tables' folder of this checkout: a benchmark run, which replaces its CSV, never
#: writes there, nor a training run whose changed settings would replace the main rows
COMMITTED_RESULTS = Path(__file__).resolve().parents[1] / RESULTS_DIR


def is_committed_results(folder) -> bool:
    """Whether ``folder`` (a path, relative to the current directory) is :data:`COMMITTED_RESULTS`."""
    return Path(folder).resolve() == COMMITTED_RESULTS


def commit_id(root=None) -> str:
    """The commit under test: ``$ANDROMEDA_COMMIT`` (set where the tree travels without .git), else
    git's short hash, ``-dirty`` when tracked files outside :data:`RESULTS_DIR` differ from it (a
    run that writes its rows into the tree stays at its commit), else ``"unknown"``."""
    env = os.environ.get("ANDROMEDA_COMMIT")
    if env:
        return env
    root = Path(__file__).resolve().parents[1] if root is None else Path(root)
    try:
        out = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=root, capture_output=True,
                             text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                                f":(exclude){RESULTS_DIR}"], cwd=root, capture_output=True, text=True,
                               timeout=10, check=True).stdout.strip()
        return out + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
