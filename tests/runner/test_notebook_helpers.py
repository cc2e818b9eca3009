"""notebook helpers: parameter type checks and metric recording."""

from __future__ import annotations

import json

import numpy as np
import pytest

from andromeda_nb.runner.notebook import record, validate_params

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
