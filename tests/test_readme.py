"""The README says true things: its example runs, its paths exist, its headline table and
docs/results.md are the committed rows."""

import re
from pathlib import Path

import numpy as np  # noqa: F401 (the example imports it too)

from andromeda_nb.analysis import results_doc

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_the_example_of_one_request_runs():
    block = README.split("## One request, end to end", 1)[1]
    code = re.search(r"```python\n(.*?)```", block, re.S).group(1)
    exec(compile(code, "README.md", "exec"), {})  # its own assertion: the batch answers as the request


def test_where_things_live_names_existing_paths():
    table = README.split("## Where things live", 1)[1].split("\n\n", 2)[1]
    paths = re.findall(r"`([\w/]+\.(?:py|ipynb))`", table)
    assert len(paths) >= 24  # six path columns of the four kernel operations (serving adds four)
    missing = [p for p in paths if not (ROOT / p).exists()]
    assert not missing, missing


def test_headline_and_history_are_the_committed_rows():
    assert results_doc.main(["--root", str(ROOT), "--check"]) == 0, (
        "run: python -m andromeda_nb.analysis.results_doc")


def test_readme_stays_short_and_names_no_commit():
    assert len(README.splitlines()) <= 150
    prose = README.split("<!-- headline:start -->")[0] + README.split("<!-- headline:end -->")[1]
    assert not [w for w in re.findall(r"\b[0-9a-f]{7,12}\b", prose) if re.search(r"[a-f]", w) and re.search(r"\d", w)]


def test_history_says_how_int8_rows_were_dequantized():
    import pandas as pd

    rows = pd.DataFrame(dict(dtype=["int8", "int8", "fp16", "int8"], math=["fp16", "fp16", "fp16", "fp32"],
                             notes=["math=fp16 dequant=fma (one HFMA2)", "math=fp16", "dequant=fma", ""]))
    assert results_doc._dequant(rows).tolist() == ["fma", "mul", "", ""]
    assert results_doc._dequant(rows.drop(columns="notes")).tolist() == ["mul", "mul", "", ""]
