"""Small helpers the notebooks call, so the notebooks stay thin.

Typical use, in the cell right after the ``parameters`` cell::

    from andromeda_nb.runner.notebook import record, validate_params
    validate_params(dict(seed=seed, ks=ks, n_ads=n_ads), defaults=dict(seed=0, ks=[10, 100], n_ads=2000))
    ...
    record("recall@100", recall, metrics_dir=metrics_dir, notebook="03_quality")
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any, Mapping

_PASS_LISTS = (
    "pass lists and dicts through a YAML parameters file (notebooks/params/*.yaml) or "
    "`python -m andromeda_nb run -p {key} \"[...]\"`; papermill's own `-p` turns them into strings"
)


def _type_name(t) -> str:
    return "None" if t is type(None) else t.__name__


def _check(key: str, value: Any, default: Any) -> None:
    # A type (or tuple of types) may stand in for an example default: {"max_ads": (int, type(None))}.
    if isinstance(default, type) or (isinstance(default, tuple) and default and all(isinstance(t, type) for t in default)):
        allowed = default if isinstance(default, tuple) else (default,)
        if isinstance(value, bool):
            ok = bool in allowed
        elif isinstance(value, int):
            ok = int in allowed or float in allowed
        else:
            ok = isinstance(value, allowed)
        if not ok:
            want = " or ".join(_type_name(t) for t in allowed)
            msg = f"parameter {key!r} must be {want}, got {type(value).__name__} {value!r}"
            if isinstance(value, str) and any(issubclass(t, (list, tuple, dict)) for t in allowed):
                msg += ": " + _PASS_LISTS.format(key=key)
            raise TypeError(msg)
        return
    if default is None:  # a None default accepts anything (it means "not set")
        return
    if isinstance(default, (list, tuple, dict)):
        kind = "dict" if isinstance(default, dict) else "list"
        if isinstance(value, str):
            raise TypeError(
                f"parameter {key!r} must be a {kind}, got the string {value!r}: " + _PASS_LISTS.format(key=key)
            )
        ok = isinstance(value, dict) if kind == "dict" else isinstance(value, (list, tuple))
        if not ok:
            raise TypeError(f"parameter {key!r} must be a {kind}, got {type(value).__name__} {value!r}")
        return
    if isinstance(default, bool):
        ok = isinstance(value, bool)
    elif isinstance(default, int):
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif isinstance(default, float):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    else:
        ok = isinstance(value, type(default))
    if not ok:
        hint = ""
        if isinstance(value, str) and isinstance(default, (int, float)) and not isinstance(default, bool):
            hint = " (YAML reads 1e6 as a string: write 1000000 or 1.0e+6)"
        elif isinstance(value, float) and isinstance(default, int) and not isinstance(default, bool):
            hint = " (write an integer)"
        raise TypeError(
            f"parameter {key!r} must be {type(default).__name__} like its default {default!r}, "
            f"got {type(value).__name__} {value!r}{hint}"
        )


def validate_params(params: Mapping[str, Any], defaults: Mapping[str, Any]) -> Mapping[str, Any]:
    """Check that each parameter has the type of its default.

    Rules: an int is accepted where the default is a float (not the other way round); bool and int
    are not interchangeable; a None default accepts any value; a list/tuple default needs a list or
    tuple, a dict default a dict; a default may also be a type or a tuple of types, e.g.
    ``(int, type(None))``. Keys of ``params`` without a default are ignored, as are defaults
    missing from ``params``.

    Args:
        params: the values the notebook received, ``{name: value}``.
        defaults: ``{name: default value or type}``.

    Returns:
        ``params``, unchanged.

    Raises:
        TypeError: a value of the wrong type, naming the parameter. A string where a list or dict
            is expected (what papermill's ``-p`` produces) says how to pass lists instead.
    """
    for key, default in defaults.items():
        if key in params:
            _check(key, params[key], default)
    return params


def _jsonable(value: Any) -> Any:
    """Plain JSON types from numpy scalars/arrays, tuples, paths; non-finite floats become None."""
    if hasattr(value, "tolist") and callable(value.tolist) and type(value).__module__.startswith("numpy"):
        value = value.tolist()  # numpy scalar or array -> Python scalar or nested lists
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    raise TypeError(f"cannot record a {type(value).__name__} as JSON: {value!r}")


def record(name: str, value: Any, metrics_dir: str | os.PathLike | None = None, notebook: str | None = None) -> Any:
    """Record a headline metric: print ``name = value`` (so it shows in the executed notebook) and,
    when ``metrics_dir`` is given, set ``name`` in ``<metrics_dir>/<notebook>.json``.

    The JSON file is a dict ``name -> value``; other names already in it are kept, a name recorded
    again is overwritten. numpy scalars and arrays become plain numbers and lists; NaN and
    infinities become null (JSON has neither).

    Args:
        name: metric name, e.g. ``"recall@100"``.
        value: a number, string, bool, None, list/dict of those, or a numpy scalar/array.
        metrics_dir: folder of the metrics files (the runner passes ``<out_dir>/metrics``); None
            only prints.
        notebook: notebook stem naming the file, e.g. ``"03_quality"`` (``.ipynb`` is stripped).

    Returns:
        ``value``, unchanged.

    Raises:
        ValueError: ``metrics_dir`` given without ``notebook``.
        TypeError: ``value`` cannot be written as JSON.
    """
    print(f"{name} = {value}")
    if metrics_dir is None:
        return value
    if not notebook:
        raise ValueError("record(): notebook= is required with metrics_dir (it names the metrics file)")
    stem = notebook[: -len(".ipynb")] if notebook.endswith(".ipynb") else notebook
    converted = _jsonable(value)  # before touching the disk: a bad value writes nothing
    folder = Path(metrics_dir)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{stem}.json"
    data = json.loads(path.read_text()) if path.is_file() else {}
    data[name] = converted
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{stem}.", suffix=".json.tmp")
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh, indent=2, sort_keys=True, allow_nan=False)
        fh.write("\n")
    os.chmod(tmp, 0o644)  # mkstemp creates 0600; metrics are meant to be read by others
    os.replace(tmp, path)
    return value
