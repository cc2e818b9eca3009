"""What a notebook calls around its parameters cell, so that the notebooks stay thin.

A notebook declares each parameter once, in its cell tagged ``parameters``, as a literal with an
optional annotation (``name: int | None = 12``, ``dtype: Literal["fp16", "int8"] = "fp16"``); the
next cell checks the values it received against that declaration::

    from andromeda_nb.runner.notebook import check_parameters
    nb = check_parameters(globals(), "02_scoring")
    ...
    nb.record("recall@100", recall)          # -> <metrics_dir>/02_scoring.json

The rules of a declaration (:func:`parameters_cell`): only ``name = literal`` or
``name: annotation = literal`` statements; an annotation may name ``int``, ``float``, ``str``,
``bool``, ``list`` (``list[int]``), ``dict``, ``None``, ``Literal[...]`` and unions of those with
``|``. Without an annotation the default's type is the parameter's type (:func:`validate_params`);
a ``None`` default needs an annotation (``metrics_dir: str | None = None``).

Relative paths in a notebook (``data/results``, ``figures``) are relative to the repository root:
the runner runs every notebook there, and :func:`check_parameters` moves a kernel that Jupyter
started in ``notebooks/`` (Jupyter starts a kernel in its notebook's folder) to that folder's parent.
"""

from __future__ import annotations

import ast
import json
import math
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

#: The folder of the series; a kernel started in it runs the notebook from its parent (module doc).
NOTEBOOKS_FOLDER = "notebooks"

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


# --------------------------------------------------------------------------------------------------
# the parameters cell: declared once, checked in the next cell
# --------------------------------------------------------------------------------------------------

PARAMETERS_TAG = "parameters"
_TYPE_NAMES = {"int": int, "float": float, "str": str, "bool": bool, "list": list, "dict": dict}


class ParametersCellError(ValueError):
    """A notebook's ``parameters`` cell is missing or holds something other than literal
    assignments with supported annotations."""


@dataclass(frozen=True)
class Declared:
    """One parameter of a ``parameters`` cell.

    Attributes:
        name: the variable.
        default: the literal the cell assigns.
        types: the allowed types (``type(None)`` for None), from the annotation; empty when the
            cell gives none (then the default's type rules, see :func:`validate_params`).
        choices: the allowed values of a ``Literal[...]`` annotation; empty otherwise.
        item_types: element types of ``list[...]`` (empty: any element).
        help: the comment at the end of the assignment's line, if any.
    """

    name: str
    default: Any
    types: tuple = ()
    choices: tuple = ()
    item_types: tuple = ()
    help: str = ""

    def check(self, value: Any) -> None:
        """Raise TypeError (wrong type) or ValueError (not one of ``choices``), naming the
        parameter; return None when ``value`` fits the declaration."""
        if self.choices:
            if not any(value == c and type(value) is type(c) for c in self.choices):
                raise ValueError(f"parameter {self.name!r} must be one of {list(self.choices)}, got {value!r}")
            return
        _check(self.name, value, self.types if self.types else self.default)
        if self.item_types and isinstance(value, (list, tuple)):
            bad = [v for v in value if not _fits(v, self.item_types)]
            if bad:
                want = " or ".join(_type_name(t) for t in self.item_types)
                raise TypeError(f"parameter {self.name!r} must hold {want} items, got {bad!r}")


def _fits(value: Any, types: tuple) -> bool:
    if isinstance(value, bool):
        return bool in types
    if isinstance(value, int):
        return int in types or float in types
    return isinstance(value, types)


def _annotation(node: ast.expr, where: str) -> tuple[tuple, tuple, tuple]:
    """(types, choices, item_types) of an annotation node."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        left, right = _annotation(node.left, where), _annotation(node.right, where)
        if left[1] or right[1]:  # Literal[...] | None: the choices plus None
            others = left[0] + right[0]
            if any(t is not type(None) for t in others):
                raise ParametersCellError(f"{where}: a Literal may be combined with None only")
            return (), left[1] + right[1] + ((None,) if others else ()), ()
        return left[0] + right[0], (), left[2] + right[2]
    if isinstance(node, ast.Constant) and node.value is None:
        return (type(None),), (), ()
    if isinstance(node, ast.Name) and node.id in _TYPE_NAMES:
        return (_TYPE_NAMES[node.id],), (), ()
    if isinstance(node, ast.Subscript):
        base = node.value.attr if isinstance(node.value, ast.Attribute) else getattr(node.value, "id", None)
        inner = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        if base == "Literal":
            try:
                return (), tuple(ast.literal_eval(e) for e in inner), ()
            except ValueError as exc:
                raise ParametersCellError(f"{where}: Literal[...] must list literals") from exc
        if base == "list" and len(inner) == 1:
            return (list,), (), _annotation(inner[0], where)[0]
        if base == "dict":
            return (dict,), (), ()
    raise ParametersCellError(
        f"{where}: unsupported annotation {ast.unparse(node)!r} (use int, float, str, bool, list[...], dict, "
        "None, Literal[...] and |)"
    )


def parse_parameters(source: str, where: str = "parameters cell") -> dict[str, Declared]:
    """The declarations of a ``parameters`` cell's source, in order (module docstring for the rules).

    Raises:
        ParametersCellError: a statement that is not ``name = literal`` or
            ``name: annotation = literal``, a value that is not a literal, an unsupported
            annotation, a name assigned twice, a None default without an annotation, or a
            default that does not fit its own annotation.
    """
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise ParametersCellError(f"{where}: not valid Python: {exc}") from exc
    lines = source.splitlines()
    out: dict[str, Declared] = {}
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            name, annotation = stmt.targets[0].id, None
        elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value is not None:
            name, annotation = stmt.target.id, stmt.annotation
        else:
            raise ParametersCellError(
                f"{where}, line {stmt.lineno}: only `name = literal` or `name: type = literal` belongs in the "
                f"parameters cell (derived values go in the next cell), got {ast.unparse(stmt)!r}"
            )
        at = f"{where}, parameter {name!r}"
        if name in out:
            raise ParametersCellError(f"{at} is assigned twice")
        try:
            default = ast.literal_eval(stmt.value)
        except ValueError as exc:
            raise ParametersCellError(
                f"{at}: the value must be a literal, got {ast.unparse(stmt.value)!r} (compute it in the next cell)"
            ) from exc
        types, choices, items = _annotation(annotation, at) if annotation is not None else ((), (), ())
        if default is None and not (types or choices):
            raise ParametersCellError(f"{at}: a None default needs an annotation, e.g. `{name}: str | None = None`")
        tail = lines[stmt.end_lineno - 1][stmt.end_col_offset:]
        help_text = tail.split("#", 1)[1].strip() if "#" in tail else ""
        declared = Declared(name, default, types, choices, items, help_text)
        try:
            declared.check(default)
        except (TypeError, ValueError) as exc:
            raise ParametersCellError(f"{at}: the default does not fit the annotation: {exc}") from exc
        out[name] = declared
    return out


def parameters_cell(notebook: str | os.PathLike) -> dict[str, Declared]:
    """The parameters declared in the notebook's cell tagged ``parameters`` (empty when it has
    none), as :func:`parse_parameters` reads them.

    Raises:
        ParametersCellError: more than one tagged cell, or a cell that breaks the rules.
    """
    import nbformat

    nb = nbformat.read(str(notebook), as_version=4)
    cells = [c for c in nb.cells if c.cell_type == "code" and PARAMETERS_TAG in c.get("metadata", {}).get("tags", [])]
    if not cells:
        return {}
    if len(cells) > 1:
        raise ParametersCellError(f"{notebook}: {len(cells)} cells are tagged {PARAMETERS_TAG!r}; tag one")
    return parse_parameters(cells[0].source, where=f"{Path(notebook).name}, parameters cell")


def _find_notebook(name: str, notebooks_dir: str | os.PathLike | None) -> Path:
    stem = name[: -len(".ipynb")] if name.endswith(".ipynb") else name
    if notebooks_dir is not None:
        folders = [Path(notebooks_dir)]
    else:  # the runner's working directory is the repository root; Jupyter may start in notebooks/
        folders = [Path.cwd() / "notebooks", Path.cwd(), Path(__file__).resolve().parents[2] / "notebooks"]
    for folder in folders:
        if (folder / f"{stem}.ipynb").is_file():
            return folder / f"{stem}.ipynb"
    raise FileNotFoundError(f"notebook {stem}.ipynb not found in {', '.join(str(f) for f in folders)}")


def _move_to_repository_root(notebook: Path) -> None:
    """When the working directory is the ``notebooks`` folder holding ``notebook`` (where Jupyter
    starts its kernel), change it to that folder's parent, where the runner runs the notebook."""
    cwd = Path.cwd()
    if cwd.name == NOTEBOOKS_FOLDER and notebook.parent.resolve() == cwd.resolve():
        os.chdir(cwd.parent)
        print(f"working directory: {cwd.parent} (the repository root, where `python -m andromeda_nb run` "
              "runs this notebook)")


@dataclass(frozen=True)
class Notebook:
    """A notebook whose parameters passed :func:`check_parameters`: its name, the values it runs
    with and where its metrics go.

    Attributes:
        name: the notebook stem, e.g. ``"02_scoring"``; it names the metrics file.
        parameters: ``{name: value}`` of every declared parameter, as received.
        metrics_dir: the ``metrics_dir`` parameter (None: :meth:`record` only prints).
    """

    name: str
    parameters: dict = field(default_factory=dict)
    metrics_dir: str | None = None

    def record(self, metric: str, value: Any) -> Any:
        """:func:`record` into ``<metrics_dir>/<name>.json``; returns ``value``."""
        return record(metric, value, metrics_dir=self.metrics_dir, notebook=self.name)

    def record_all(self, metrics: Mapping[str, Any]) -> dict:
        """:meth:`record` each ``{metric: value}``, in order; returns them as a dict."""
        for metric, value in metrics.items():
            self.record(metric, value)
        return dict(metrics)


def check_parameters(namespace: Mapping[str, Any], notebook: str,
                     notebooks_dir: str | os.PathLike | None = None) -> Notebook:
    """Check the values a notebook received against its own ``parameters`` cell.

    Call it in the cell after the parameters cell: ``nb = check_parameters(globals(), "02_scoring")``.
    The declarations are read from the notebook file (``notebooks/<notebook>.ipynb`` under the
    working directory, the working directory itself, or the repository's ``notebooks/``), so the
    parameter list is written once. When it is found in the working directory and that is a
    folder named ``notebooks`` (JupyterLab's kernel), the working directory becomes its parent,
    the repository root, as in a batch run, and a line says so.

    Args:
        namespace: the notebook's globals.
        notebook: its stem, e.g. ``"02_scoring"``.
        notebooks_dir: where the notebook file is; None searches as above.

    Returns:
        A :class:`Notebook` carrying the values and the metrics folder.

    Raises:
        FileNotFoundError: the notebook file is not found.
        ParametersCellError: the notebook has no ``parameters`` cell or it breaks the rules.
        NameError: a declared parameter is not defined in ``namespace``.
        TypeError, ValueError: a value does not fit its declaration; the message names it (a
            string where a list is expected says how to pass lists).
    """
    path = _find_notebook(notebook, notebooks_dir)
    declared = parameters_cell(path)
    if not declared:
        raise ParametersCellError(f"{path.name} has no cell tagged {PARAMETERS_TAG!r}")
    missing = [n for n in declared if n not in namespace]
    if missing:
        raise NameError(f"{path.name}: parameter(s) {missing} are declared but not defined (run the parameters cell)")
    for name, decl in declared.items():
        decl.check(namespace[name])
    values = {name: namespace[name] for name in declared}
    metrics_dir = values.get("metrics_dir")
    if notebooks_dir is None:
        _move_to_repository_root(path)
    return Notebook(path.stem, values, None if metrics_dir is None else os.fspath(metrics_dir))
