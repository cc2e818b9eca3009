"""notebook helpers: the parameters cell and its checks, parameter type checks, metric recording."""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import numpy as np
import pytest

from nbformat.v4 import new_code_cell, new_notebook

from andromeda_nb.runner.notebook import (Notebook, ParametersCellError, check_parameters, parameters_cell,
                                          parse_parameters, record, validate_params)

DEFAULTS = {"seed": 0, "ks": [10, 100], "lr": 0.1, "use_int8": False, "backend": "auto",
            "limits": {"a": 1}, "max_ads": None}


def test_good_params_pass_and_are_returned():
    params = {"seed": 3, "ks": [1, 2], "lr": 1, "use_int8": True, "backend": "cuda", "limits": {},
              "max_ads": 500, "unknown": object()}
    assert validate_params(params, DEFAULTS) is params
    assert validate_params({"ks": (1, 2), "max_ads": None}, DEFAULTS)


def test_stringified_list_explains_how_to_pass_lists():
    with pytest.raises(TypeError, match=r"'ks' must be a list, got the string '\[10, 50\]'.*YAML parameters file.*-p ks"):
        validate_params({"ks": "[10, 50]"}, DEFAULTS)
    with pytest.raises(TypeError, match=r"'limits' must be a dict"):
        validate_params({"limits": "{a: 2}"}, DEFAULTS)


@pytest.mark.parametrize("key, value", [
    ("seed", 1.5), ("seed", True), ("seed", "3"), ("lr", "1e-3"), ("lr", False),
    ("use_int8", 1), ("backend", 0), ("ks", 10), ("limits", [1]),
])
def test_wrong_types_raise_naming_the_key(key, value):
    with pytest.raises(TypeError, match=repr(key)):
        validate_params({key: value}, DEFAULTS)


def test_type_specs_as_defaults():
    spec = {"max_ads": (int, type(None)), "scale": float, "ks": list}
    validate_params({"max_ads": None, "scale": 2, "ks": [1]}, spec)
    validate_params({"max_ads": 7}, spec)
    with pytest.raises(TypeError, match="'max_ads' must be int or None"):
        validate_params({"max_ads": True}, spec)
    with pytest.raises(TypeError, match="YAML parameters file"):
        validate_params({"ks": "[1]"}, spec)


def test_record_prints_and_merges_json(tmp_path, capsys):
    value = np.float32(0.25)
    assert record("recall@100", value, metrics_dir=tmp_path / "m", notebook="03_quality.ipynb") is value
    record("ads_per_s", np.int64(12), metrics_dir=tmp_path / "m", notebook="03_quality")
    record("curve", np.array([1.5, np.nan]), metrics_dir=tmp_path / "m", notebook="03_quality")
    record("recall@100", 0.5, metrics_dir=tmp_path / "m", notebook="03_quality")  # updates
    assert "recall@100 = 0.25" in capsys.readouterr().out
    data = json.loads((tmp_path / "m" / "03_quality.json").read_text())
    assert data == {"recall@100": 0.5, "ads_per_s": 12, "curve": [1.5, None]}
    assert [p.name for p in (tmp_path / "m").iterdir()] == ["03_quality.json"]  # no temp files left


def test_record_without_dir_only_prints_and_needs_notebook_with_dir(tmp_path, capsys):
    assert record("n", 3) == 3
    assert capsys.readouterr().out == "n = 3\n"
    with pytest.raises(ValueError, match="notebook="):
        record("n", 3, metrics_dir=tmp_path)
    with pytest.raises(TypeError, match="cannot record"):
        record("n", object(), metrics_dir=tmp_path, notebook="x")


CELL = """\
backend: Literal["auto", "cuda", "cudasim"] = "auto"   # GPU if present
n_users: int | None = 12                               # None: every user
ks: list[int] = [10, 50]
scale = 1.5
mode: Literal["a", "b"] | None = None
figures_dir = "figures"
metrics_dir: str | None = None
"""


def test_parse_parameters_reads_literals_annotations_and_help():
    got = parse_parameters(CELL)
    assert list(got) == ["backend", "n_users", "ks", "scale", "mode", "figures_dir", "metrics_dir"]
    assert got["backend"].choices == ("auto", "cuda", "cudasim") and got["backend"].help == "GPU if present"
    assert got["n_users"].default == 12 and got["n_users"].types == (int, type(None))
    assert got["ks"].item_types == (int,) and got["mode"].choices == ("a", "b", None)
    assert got["scale"].types == () and got["scale"].default == 1.5  # the default's type rules


@pytest.mark.parametrize("name, value, error, message", [
    ("backend", "gpu", ValueError, r"'backend' must be one of \['auto', 'cuda', 'cudasim'\]"),
    ("n_users", 1.5, TypeError, r"'n_users' must be int or None"),
    ("n_users", True, TypeError, r"'n_users'"),
    ("ks", "[10, 50]", TypeError, r"'ks' must be list.*YAML parameters file"),
    ("ks", [10, 2.5], TypeError, r"'ks' must hold int items"),
    ("scale", "1e6", TypeError, r"YAML reads 1e6 as a string"),
    ("mode", "c", ValueError, r"'mode' must be one of"),
])
def test_declared_parameters_refuse_bad_values(name, value, error, message):
    with pytest.raises(error, match=message):
        parse_parameters(CELL)[name].check(value)


def test_declared_parameters_accept_good_values():
    got = parse_parameters(CELL)
    for name, value in [("n_users", None), ("n_users", 3), ("scale", 2), ("mode", None), ("mode", "b"),
                        ("ks", [1]), ("metrics_dir", "out/m")]:
        got[name].check(value)


@pytest.mark.parametrize("source, message", [
    ("x = y", r"'x': the value must be a literal"),
    ("x = 1\nx = 2", r"'x' is assigned twice"),
    ("x = None", r"a None default needs an annotation"),
    ("x: Literal['a'] = 'b'", r"the default does not fit the annotation"),
    ("x: set = 1", r"unsupported annotation 'set'"),
    ("x: Literal['a'] | int = 'a'", r"a Literal may be combined with None only"),
    ("import os", r"line 1: only `name = literal`"),
    ("x = (", r"not valid Python"),
])
def test_parameters_cell_rules(source, message):
    with pytest.raises(ParametersCellError, match=message):
        parse_parameters(source)


def _notebook(path, *cells):
    nb = new_notebook()
    for source, tags in cells:
        cell = new_code_cell(source)
        cell.metadata["tags"] = tags
        nb.cells.append(cell)
    nbformat.write(nb, str(path))
    return path


def test_check_parameters_reads_the_notebook_once_and_records(tmp_path, capsys):
    _notebook(tmp_path / "07_demo.ipynb", ("import os", []), (CELL, ["parameters"]))
    values = {**{k: d.default for k, d in parse_parameters(CELL).items()}, "n_users": None,
              "metrics_dir": str(tmp_path / "m"), "unrelated": object()}
    nb = check_parameters(values, "07_demo", notebooks_dir=tmp_path)
    assert isinstance(nb, Notebook) and nb.name == "07_demo" and nb.metrics_dir == str(tmp_path / "m")
    assert set(nb.parameters) == set(parse_parameters(CELL)) and nb.parameters["n_users"] is None
    assert nb.record_all({"a": 1, "b": np.float64(0.5)}) == {"a": 1, "b": 0.5}
    assert json.loads((tmp_path / "m" / "07_demo.json").read_text()) == {"a": 1, "b": 0.5}
    assert "a = 1" in capsys.readouterr().out
    with pytest.raises(ValueError, match="'backend' must be one of"):
        check_parameters({**values, "backend": "tpu"}, "07_demo", notebooks_dir=tmp_path)
    with pytest.raises(NameError, match=r"\['scale'\] are declared but not defined"):
        check_parameters({k: v for k, v in values.items() if k != "scale"}, "07_demo", notebooks_dir=tmp_path)
    with pytest.raises(FileNotFoundError, match="08_none.ipynb not found"):
        check_parameters(values, "08_none", notebooks_dir=tmp_path)


def test_a_kernel_started_in_notebooks_runs_in_the_repository_root(tmp_path, monkeypatch, capsys):
    """JupyterLab starts the kernel in notebooks/; the runner runs the notebook in its parent."""
    folder = tmp_path / "notebooks"
    folder.mkdir()
    _notebook(folder / "07_demo.ipynb", ("x = 1", ["parameters"]))
    monkeypatch.chdir(folder)
    with pytest.raises(TypeError):  # a failed check moves nothing
        check_parameters({"x": "one"}, "07_demo")
    assert Path.cwd() == folder
    check_parameters({"x": 2}, "07_demo")
    assert Path.cwd() == tmp_path
    assert f"working directory: {tmp_path} (the repository root" in capsys.readouterr().out
    check_parameters({"x": 2}, "07_demo")  # run again from the root: found in notebooks/, stays
    assert Path.cwd() == tmp_path and not capsys.readouterr().out


@pytest.mark.parametrize("folder_name, notebooks_dir", [("scratch", None), ("notebooks", ".")])
def test_a_kernel_stays_where_it_is_outside_notebooks_or_told_where_the_notebook_is(tmp_path, monkeypatch, capsys,
                                                                                     folder_name, notebooks_dir):
    folder = tmp_path / folder_name
    folder.mkdir()
    _notebook(folder / "07_demo.ipynb", ("x = 1", ["parameters"]))
    monkeypatch.chdir(folder)
    check_parameters({"x": 2}, "07_demo", notebooks_dir=notebooks_dir)
    assert Path.cwd() == folder and not capsys.readouterr().out


def test_parameters_cell_missing_or_tagged_twice(tmp_path):
    assert parameters_cell(_notebook(tmp_path / "a.ipynb", ("x = 1", []))) == {}
    with pytest.raises(ParametersCellError, match="has no cell tagged 'parameters'"):
        check_parameters({"x": 1}, "a", notebooks_dir=tmp_path)
    with pytest.raises(ParametersCellError, match="2 cells are tagged"):
        parameters_cell(_notebook(tmp_path / "b.ipynb", ("x = 1", ["parameters"]), ("y = 2", ["parameters"])))
