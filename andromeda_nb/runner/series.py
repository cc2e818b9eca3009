"""Run the notebook series with papermill: one parameters file, typed values, atomic outputs.

The series is every ``notebooks/*.ipynb`` in name order. Each notebook is executed by papermill in
the repository root (the parent of the notebooks folder), so relative paths such as ``data/`` and
``figures/`` mean the same thing in JupyterLab and in a batch run.

Parameters come from a YAML file (a preset name, ``notebooks/params/<name>.yaml``, or a path)::

    common:            # offered to every notebook; a notebook gets only the keys it declares
      seed: 0
    01_quickstart:     # one section per notebook stem; every key must be declared by it
      n_ads: 2000

A notebook *declares* a key by assigning it a literal in its cell tagged ``parameters`` (read by
:func:`andromeda_nb.runner.notebook.parameters_cell`, which also checks the cell's rules). Precedence, lowest first: the notebook's own defaults, ``common``,
its section, the runner's paths (``figures_dir``, ``metrics_dir``), ``overrides``, ``backend``.
Configuration mistakes (a key no notebook declares, a section for a notebook that does not exist,
a pattern in ``only`` that matches nothing) raise :class:`ParameterError` before any kernel starts.

Each notebook runs on the kernel its metadata names (``kernelspec.name``, ``python3`` for the
committed ones); a kernel that is not installed is refused with :class:`KernelNotInstalled`
before any notebook runs. A notebook succeeds only when it ran to the end: a cell that raised
(``SystemExit`` included, which papermill itself lets pass when its code is 0 or empty) or a code
cell left unexecuted (after an early stop, or tagged ``skip-execution``) fails it. Progress bars
are tqdm's text bars in the executed copies (:mod:`andromeda_nb.runner.text_progress`), each kept
as a terminal would show it at the end (:func:`coalesce_streams`), not as its hundreds of updates.

Outputs, under ``out_dir``: ``<stem>.ipynb`` for each notebook that ran to the end (written under
a temporary name and renamed only on success), ``<stem>.FAILED.ipynb`` for the one that failed
(the partially executed copy; papermill marks the cell that raised), ``metrics/<stem>.json`` for
metrics the notebooks record, and ``series.json`` only when every notebook of the run succeeded.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import fnmatch
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

import nbformat
import papermill
import traitlets
import yaml
from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel
from jupyter_client.manager import AsyncKernelManager
from papermill.exceptions import PapermillExecutionError
from tqdm.auto import tqdm

from .notebook import Declared, ParametersCellError, parameters_cell

#: Tag with which nbclient skips a cell; the runner fails a notebook that has one (it never ran).
SKIP_TAG = "skip-execution"
#: Kernel arguments of every run on ipykernel: the IPython extension that gives the executed
#: copies text progress bars.
KERNEL_ARGUMENTS = ("--ext=andromeda_nb.runner.text_progress",)
#: Keys the runner sets itself (from ``figures_dir`` and ``out_dir``); a YAML file may not set them.
RUNNER_KEYS = ("figures_dir", "metrics_dir")
SERIES_FILE = "series.json"
FAILED_SUFFIX = ".FAILED.ipynb"


def coalesce_streams(nb):
    """``nb`` (changed in place and returned) with each cell's consecutive outputs of one stream
    (stdout, stderr) merged into one, and every line as a terminal shows it once written: each
    carriage return starts overwriting the line from its first column. A text progress bar sends
    one output an update; the executed copy keeps its final line."""
    for cell in nb.cells:
        merged = []
        for out in cell.get("outputs", []):
            last = merged[-1] if merged else None
            if (out.get("output_type") == "stream" and last is not None and last.get("output_type") == "stream"
                    and last.get("name") == out.get("name")):
                last["text"] += out["text"]
            else:
                merged.append(out)
        for out in merged:
            if out.get("output_type") == "stream" and "\r" in out["text"]:
                out["text"] = "\n".join(_overwritten(line) for line in out["text"].split("\n"))
        if "outputs" in cell:
            cell["outputs"] = merged
    return nb


def _overwritten(line: str) -> str:
    parts = line.split("\r")
    shown = ""
    for part in parts:
        shown = part + shown[len(part):]
    return shown.rstrip() if len(parts) > 1 else shown  # a bar's padding spaces


class SeriesError(RuntimeError):
    """The series could not run: a notebook failed, the kernel died or timed out, or the
    configuration is wrong (see :class:`ParameterError`)."""


class ParameterError(SeriesError, ValueError):
    """The parameters file, ``only`` or ``overrides`` do not fit the notebooks (raised before any
    notebook runs)."""


class KernelNotInstalled(SeriesError, LookupError):
    """A notebook's kernelspec names no kernel installed for this Python, or it names none
    (raised before any notebook runs; the message names the notebook and the kernel)."""


@dataclass(frozen=True)
class PlannedNotebook:
    """One notebook of a planned run: its source path and the parameters it will receive."""

    name: str
    source: Path
    parameters: dict[str, Any]
    declared: tuple[str, ...] = ()
    kernel: str = "python3"


@dataclass(frozen=True)
class NotebookRun:
    """One notebook that ran to the end.

    Attributes:
        name: the notebook stem, e.g. ``"01_quickstart"``.
        path: the executed copy, ``<out_dir>/<name>.ipynb``.
        seconds: wall time of the papermill run (kernel start included).
        parameters: the parameters passed to papermill (the notebook's defaults apply to the rest).
        kernel: the kernel it ran on (its kernelspec's name).
    """

    name: str
    path: Path
    seconds: float
    parameters: dict[str, Any] = field(default_factory=dict)
    kernel: str = "python3"


# --------------------------------------------------------------------------------------------------
# planning: find notebooks, read the parameters file, merge
# --------------------------------------------------------------------------------------------------


def find_notebooks(notebooks_dir: str | os.PathLike = "notebooks") -> list[Path]:
    """All ``*.ipynb`` directly in ``notebooks_dir``, sorted by name (checkpoints and the runner's
    own temporary files skipped).

    Raises:
        ParameterError: the folder does not exist.
    """
    folder = Path(notebooks_dir)
    if not folder.is_dir():
        raise ParameterError(f"notebooks folder {str(folder)!r} does not exist")
    return sorted(
        p for p in folder.glob("*.ipynb")
        if p.is_file() and not p.name.startswith(".") and ".ipynb_checkpoints" not in p.parts
    )


def resolve_params_file(params: str | os.PathLike | None, notebooks_dir: str | os.PathLike = "notebooks") -> Path | None:
    """Turn a preset name (``"smoke"`` -> ``<notebooks_dir>/params/smoke.yaml``) or a path into a path.

    Returns None when ``params`` is None (no parameters file: every notebook runs on its defaults).

    Raises:
        ParameterError: neither a preset nor an existing file (the message lists the presets).
    """
    if params is None:
        return None
    text = os.fspath(params)
    preset_dir = Path(notebooks_dir) / "params"
    looks_like_path = (
        isinstance(params, os.PathLike) or os.sep in text or "/" in text or text.endswith((".yaml", ".yml"))
    )
    if not looks_like_path:
        candidate = preset_dir / f"{text}.yaml"
        if candidate.is_file():
            return candidate
    path = Path(text)
    if path.is_file():
        return path
    presets = sorted(p.stem for p in preset_dir.glob("*.yaml")) if preset_dir.is_dir() else []
    raise ParameterError(
        f"parameters {text!r}: no such preset or file (presets in {preset_dir}: {', '.join(presets) or 'none'})"
    )


def load_params_file(path: str | os.PathLike | None) -> dict[str, dict[str, Any]]:
    """Read a parameters YAML file into ``{section: {key: value}}`` (values keep their YAML types).

    An empty file or an empty section (``common:`` with nothing under it) reads as ``{}``.

    Raises:
        ParameterError: the YAML does not parse, or it is not a mapping of mappings.
    """
    if path is None:
        return {}
    try:
        data = yaml.safe_load(Path(path).read_text())
    except yaml.YAMLError as exc:
        raise ParameterError(f"parameters file {path}: invalid YAML: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ParameterError(f"parameters file {path}: expected a mapping of sections, got {type(data).__name__}")
    sections: dict[str, dict[str, Any]] = {}
    for name, body in data.items():
        if body is None:
            body = {}
        if not isinstance(body, dict):
            raise ParameterError(
                f"parameters file {path}: section {name!r} must be a mapping of key: value, got {type(body).__name__}"
            )
        bad = [k for k in body if not isinstance(k, str) or not k.isidentifier()]
        if bad:
            raise ParameterError(f"parameters file {path}: section {name!r} has keys that are not Python names: {bad}")
        sections[str(name)] = dict(body)
    return sections


def declared_parameters(notebook: str | os.PathLike) -> dict[str, Declared]:
    """The parameters a notebook declares in its ``parameters``-tagged cell
    (:func:`andromeda_nb.runner.notebook.parameters_cell`); empty when it has no such cell.

    Raises:
        ParameterError: the cell breaks the rules of a parameters cell (literal assignments only).
    """
    try:
        return parameters_cell(notebook)
    except ParametersCellError as exc:
        raise ParameterError(str(exc)) from exc


def _select(notebooks: list[Path], only: Iterable[str] | None) -> list[Path]:
    if only is None:
        return notebooks
    if isinstance(only, str):
        only = [only]
    chosen: set[Path] = set()
    for pattern in only:
        pat = pattern[: -len(".ipynb")] if pattern.endswith(".ipynb") else pattern
        hits = [p for p in notebooks if fnmatch.fnmatchcase(p.stem, pat)]
        if not hits:
            names = ", ".join(p.stem for p in notebooks) or "none"
            raise ParameterError(f"only: {pattern!r} matches no notebook (notebooks: {names})")
        chosen.update(hits)
    return [p for p in notebooks if p in chosen]


def notebook_kernel(notebook: str | os.PathLike) -> str:
    """The kernel a notebook asks for: the ``name`` of its metadata's ``kernelspec`` (what
    JupyterLab writes when the notebook is saved).

    Raises:
        KernelNotInstalled: the notebook names no kernel.
    """
    nb = nbformat.read(str(notebook), as_version=4)
    name = (nb.metadata.get("kernelspec") or {}).get("name")
    if not name:
        raise KernelNotInstalled(
            f"notebook {Path(notebook).name} names no kernel (its metadata has no kernelspec): open it in "
            "JupyterLab, pick a kernel (Kernel > Change Kernel) and save it"
        )
    return str(name)


def check_kernels_installed(kernels: Mapping[str, str]) -> None:
    """Check that every kernel named is installed where this Python's Jupyter looks for kernels
    (the kernels papermill can start).

    Args:
        kernels: ``{notebook stem: kernel name}``.

    Raises:
        KernelNotInstalled: naming the first notebook (in the mapping's order) whose kernel is not
            installed, the kernel, and the kernels that are.
    """
    manager = KernelSpecManager()
    for stem, kernel in kernels.items():
        try:
            manager.get_kernel_spec(kernel)
        except NoSuchKernel:
            installed = ", ".join(sorted(manager.find_kernel_specs())) or "none"
            raise KernelNotInstalled(
                f"notebook {stem}.ipynb asks for kernel {kernel!r} (its kernelspec), which is not installed for "
                f"{sys.executable} (installed: {installed}). Register it with the Python it should run "
                f"(`python -m ipykernel install --user --name {kernel}`), or pick an installed kernel in "
                "JupyterLab (Kernel > Change Kernel) and save the notebook"
            ) from None


#: seconds a notebook's kernel may take to start (papermill's default: 60)
KERNEL_START_TIMEOUT_S = 300


class _LocalKernelManager(AsyncKernelManager):
    """The kernel of a series run talks to papermill over Unix sockets where there are any: both
    run on this machine, and ipykernel warns about unencrypted TCP once a notebook."""

    @traitlets.default("transport")
    def _default_transport(self) -> str:
        return "ipc" if os.name == "posix" else "tcp"

    @traitlets.default("ip")
    def _default_ip(self) -> str:
        # jupyter_client's default socket prefix is "kernel-ipc" in the working directory: two
        # kernels started at once there (two test workers, two series) would share its sockets
        if self.transport == "ipc":
            return os.path.join(tempfile.gettempdir(), f"andromeda-kernel-{uuid.uuid4().hex}-ipc")
        return super()._ip_default()


def _kernel_arguments(kernel: str) -> list[str]:
    """:data:`KERNEL_ARGUMENTS` for a kernel that runs ipykernel (they are IPython options), else none."""
    argv = KernelSpecManager().get_kernel_spec(kernel).argv
    return list(KERNEL_ARGUMENTS) if any("ipykernel" in arg for arg in argv) else []


def _kernel_path(path: Path, root: Path) -> str:
    """A path as the notebook (running in ``root``) should see it: relative to root when inside it."""
    try:
        return path.relative_to(root).as_posix() or "."
    except ValueError:
        return str(path)


def plan_series(
    notebooks_dir: str | os.PathLike = "notebooks",
    params: str | os.PathLike | None = "default",
    out_dir: str | os.PathLike = "build/notebooks",
    figures_dir: str | os.PathLike = "figures",
    only: Iterable[str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    backend: str | None = None,
) -> list[PlannedNotebook]:
    """Work out which notebooks run and with which parameters, without running anything.

    Arguments are those of :func:`run_series`. Relative ``out_dir`` and ``figures_dir`` are taken
    relative to the current directory and handed to the notebooks relative to the repository root
    (the parent of ``notebooks_dir``) when they lie inside it, else as absolute paths.

    Returns:
        The notebooks in run order, each with the exact parameters papermill will inject.

    Raises:
        ParameterError: ``out_dir`` is ``notebooks_dir``; no notebook selected; a section names a notebook that does not exist; a
            section key the notebook does not declare; a ``common`` key no notebook declares; an
            ``overrides`` key (or ``backend``) no selected notebook declares; a YAML file that sets
            ``figures_dir`` or ``metrics_dir`` (use the arguments); a bad parameters file.
        KernelNotInstalled: a selected notebook's kernelspec names a kernel that is not installed
            (or none).
    """
    all_notebooks = find_notebooks(notebooks_dir)
    root = Path(notebooks_dir).resolve().parent
    if Path(out_dir).resolve() == Path(notebooks_dir).resolve():
        raise ParameterError(f"out_dir {out_dir} is the notebooks' own folder: the executed copies would replace "
                             "the source notebooks (give another folder, e.g. build/notebooks)")
    params_path = resolve_params_file(params, notebooks_dir)
    sections = load_params_file(params_path)
    source = str(params_path) if params_path else "parameters"
    common = sections.pop("common", {})

    declared = {p.stem: declared_parameters(p) for p in all_notebooks}

    # Validate the whole file against all notebooks, whatever `only` selects: a typo is a typo.
    unknown_sections = sorted(set(sections) - set(declared))
    if unknown_sections:
        raise ParameterError(
            f"{source}: section(s) {unknown_sections} name no notebook in {notebooks_dir} "
            f"(notebooks: {', '.join(declared) or 'none'})"
        )
    for name, body in sections.items():
        undeclared = sorted(set(body) - set(declared[name]))
        if undeclared:
            raise ParameterError(
                f"{source}: notebook {name}.ipynb does not declare parameter(s) {undeclared} in its "
                f"'parameters' cell (declared: {sorted(declared[name]) or 'none'})"
            )
    all_declared = set().union(*declared.values()) if declared else set()
    stray_common = sorted(set(common) - all_declared)
    if stray_common:
        raise ParameterError(f"{source}: common key(s) {stray_common} are declared by no notebook in {notebooks_dir}")
    for section_name, body in [("common", common), *sections.items()]:
        taken = sorted(set(body) & set(RUNNER_KEYS))
        if taken:
            raise ParameterError(
                f"{source}: section {section_name!r} sets {taken}; the runner sets these "
                "(use --figures / --out, or figures_dir= / out_dir= of run_series)"
            )

    selected = _select(all_notebooks, only)
    if not selected:
        raise ParameterError(f"no notebooks to run in {notebooks_dir}")

    runner_values = {
        "figures_dir": _kernel_path(Path(figures_dir).resolve(), root),
        "metrics_dir": _kernel_path((Path(out_dir) / "metrics").resolve(), root),
    }
    late = dict(overrides or {})
    if backend is not None:
        late["backend"] = backend
    selected_declared = set().union(*(declared[p.stem] for p in selected))
    stray_late = sorted(set(late) - selected_declared)
    if stray_late:
        raise ParameterError(
            f"override(s) {stray_late} are declared by none of the notebooks being run "
            f"({', '.join(p.stem for p in selected)})"
        )

    kernels = {p.stem: notebook_kernel(p) for p in selected}
    check_kernels_installed(kernels)

    plan = []
    for path in selected:
        names = declared[path.stem]
        values: dict[str, Any] = {}
        for layer in (common, sections.get(path.stem, {}), runner_values, late):
            values.update({k: v for k, v in layer.items() if k in names})
        plan.append(PlannedNotebook(path.stem, path, values, tuple(names), kernels[path.stem]))
    return plan


# --------------------------------------------------------------------------------------------------
# running
# --------------------------------------------------------------------------------------------------


class _DropParameterCellWarnings(logging.Filter):
    """papermill reads the parameters cell with its own regex and warns "Passed unknown parameter"
    for every annotated parameter (``n: int | None = 3``) and "Unable to parse line" for a line with
    an ``=`` in its comment. The runner has already read the cell with
    :func:`~andromeda_nb.runner.notebook.parameters_cell` and checked each key against it
    (:func:`plan_series`), so these warnings are noise."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(("Passed unknown parameter", "Unable to parse line"))


@contextlib.contextmanager
def _quiet_papermill_parameter_check():
    # a logger's filters see only its own records, so both loggers that warn get the filter
    logs = [logging.getLogger("papermill"), logging.getLogger("papermill.translators")]
    flt = _DropParameterCellWarnings()
    for log in logs:
        log.addFilter(flt)
    try:
        yield
    finally:
        for log in logs:
            log.removeFilter(flt)


def _git(root: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _failing_cell(partial: Path) -> tuple[int | None, Any, str]:
    """Index, execution count and source of the cell that was running when a kernel died or timed
    out: the last cell papermill marked as started in the partially executed copy."""
    try:
        nb = nbformat.read(str(partial), as_version=4)
    except Exception:  # noqa: BLE001 - best effort: the copy may be missing or truncated
        return None, None, ""
    found = (None, None, "")
    for index, cell in enumerate(nb.cells):
        if cell.get("metadata", {}).get("papermill", {}).get("start_time"):
            found = (index, cell.get("execution_count"), cell.get("source", ""))
    return found


def _first_line(source: str) -> str:
    lines = [ln.strip() for ln in source.splitlines() if ln.strip()]
    if not lines:
        return ""
    return lines[0] if len(lines) == 1 else f"{lines[0]} ..."


def _cells(indices: list[int]) -> str:
    return f"cell {indices[0]}" if len(indices) == 1 else f"cells {', '.join(map(str, indices))}"


def why_unfinished(nb: nbformat.NotebookNode) -> str | None:
    """Why an executed notebook did not run to the end, or None when it did.

    It did not when a code cell holds an error (papermill returns normally from a ``SystemExit``
    whose code is 0 or empty, having stopped there) or when a code cell with source has no
    execution count: a cell after such a stop, or one tagged ``skip-execution`` (nbclient skips it).

    Returns:
        ``"in cell I (execution count N): Ename: value; cells J, K never ran"`` and the like, the
        indices those of ``nb.cells``, followed by ``"\n  cell source: <first line>"``.
    """
    code = [(index, cell) for index, cell in enumerate(nb.cells) if cell.cell_type == "code"]
    never_ran = [index for index, cell in code if cell.source.strip() and cell.get("execution_count") is None]
    for index, cell in code:
        errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
        if errors:
            count = cell.get("execution_count")
            what = f"{errors[0].get('ename', 'error')}: {errors[0].get('evalue', '')}".rstrip(": ")
            msg = f"in cell {index}" + (f" (execution count {count})" if count is not None else "") + f": {what}"
            after = [i for i in never_ran if i > index]
            if after:
                msg += f"; {_cells(after)} never ran"
            return msg + _source_line(cell.source)
    if never_ran:
        first = nb.cells[never_ran[0]]
        skipped = [i for i in never_ran if SKIP_TAG in nb.cells[i].get("metadata", {}).get("tags", [])]
        msg = f"{_cells(never_ran)} never ran"
        if skipped:
            msg += f" ({_cells(skipped)} tagged {SKIP_TAG!r})"
        return msg + _source_line(first.source)
    return None


def _source_line(source: str) -> str:
    line = _first_line(source)
    return f"\n  cell source: {line}" if line else ""


def _describe_failure(name: str, exc: BaseException, partial: Path | None) -> str:
    if isinstance(exc, PapermillExecutionError):
        index, count, source = exc.cell_index, exc.exec_count, exc.source or ""
        what = f"{exc.ename}: {exc.evalue}"
    else:
        index, count, source = _failing_cell(partial) if partial else (None, None, "")
        detail = str(exc).strip().splitlines()
        what = f"{type(exc).__name__}: {detail[0] if detail else ''}".rstrip(": ")
    if index is None:
        where = "before any cell ran"
    else:
        where = f"in cell {index}" + (f" (execution count {count})" if count is not None else "")
    return f"notebook {name}.ipynb failed {where}: {what}" + _source_line(source)


def run_series(
    notebooks_dir: str | os.PathLike = "notebooks",
    params: str | os.PathLike | None = "default",
    out_dir: str | os.PathLike = "build/notebooks",
    figures_dir: str | os.PathLike = "figures",
    only: Iterable[str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    backend: str | None = None,
    progress: bool = True,
    execution_timeout: float | None = None,
) -> list[NotebookRun]:
    """Execute the notebook series with papermill and write the executed copies to ``out_dir``.

    Args:
        notebooks_dir: folder of the notebooks; its parent is the working directory of every run.
        params: a preset name (``<notebooks_dir>/params/<name>.yaml``), a path to a YAML file, or
            None for no file. Layout: ``common:`` plus one section per notebook stem (module doc).
        out_dir: where executed copies, ``metrics/`` and ``series.json`` go (created).
        figures_dir: handed to notebooks that declare ``figures_dir``.
        only: notebook stems or glob patterns (``"02_*"``) restricting the run; None runs all.
        overrides: ``{key: value}`` applied last, to every selected notebook that declares the key.
        backend: ``"auto"``, ``"cuda"`` or ``"cudasim"``: an override of the ``backend`` key.
        progress: show a bar over notebooks and papermill's bar over cells on a terminal; where
            stderr is not one (a log file), one line a notebook instead (redrawn bars would fill
            the log with cursor codes and partial lines).
        execution_timeout: seconds one cell may run before the run is abandoned (None: no limit).

    Returns:
        One :class:`NotebookRun` per notebook, in run order (all of them succeeded).

    Raises:
        ParameterError: the configuration does not fit the notebooks (nothing has run).
        KernelNotInstalled: a selected notebook's kernel is not installed (nothing has run).
        SeriesError: a notebook raised (``SystemExit`` included), stopped early or skipped a cell
            (:func:`why_unfinished`), its kernel died or a cell timed out. The message names the
            notebook and the cell; the partial copy is ``<out_dir>/<stem>.FAILED.ipynb``; no
            ``series.json`` is written; the notebooks after it do not run.
    """
    if only is not None:
        only = [only] if isinstance(only, str) else list(only)
    plan = plan_series(notebooks_dir, params, out_dir, figures_dir, only, overrides, backend)
    root = Path(notebooks_dir).resolve().parent
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    (out / SERIES_FILE).unlink(missing_ok=True)
    params_path = resolve_params_file(params, notebooks_dir)
    started = _dt.datetime.now(_dt.timezone.utc)

    runs: list[NotebookRun] = []
    bars = progress and sys.stderr.isatty()
    bar = tqdm(plan, desc="notebooks", unit="nb", disable=not bars, position=0, leave=True)
    for item in bar:
        bar.set_postfix_str(item.name)
        final = out / f"{item.name}.ipynb"
        failed = out / f"{item.name}{FAILED_SUFFIX}"
        for stale in (final, failed, out / "metrics" / f"{item.name}.json"):
            stale.unlink(missing_ok=True)  # record() merges into its file: start each run clean
        tmp = out / f".{item.name}.{uuid.uuid4().hex[:12]}.running.ipynb"  # hidden, unique, normal mode
        t0 = time.perf_counter()
        try:
            with _quiet_papermill_parameter_check():
                executed = papermill.execute_notebook(
                    str(item.source.resolve()),
                    str(tmp),
                    parameters=item.parameters,
                    kernel_name=item.kernel,
                    progress_bar={"desc": item.name, "leave": False, "position": 1} if bars else False,
                    log_output=False,
                    cwd=str(root),
                    execution_timeout=execution_timeout,
                    extra_arguments=_kernel_arguments(item.kernel),
                    kernel_manager_class=_LocalKernelManager,
                    # a kernel importing numpy, pandas and numba on a busy 2-core machine (two test
                    # workers each starting kernels) can take longer than papermill's 60 s to answer
                    start_timeout=KERNEL_START_TIMEOUT_S,
                )
            unfinished = why_unfinished(executed)
        except BaseException as exc:
            partial = tmp if tmp.exists() and tmp.stat().st_size > 0 else None
            message = _describe_failure(item.name, exc, partial)
            if partial is not None:
                os.replace(tmp, failed)
                message += f"\n  partially executed copy: {_kernel_path(failed, Path.cwd().resolve())}"
            bar.close()
            if isinstance(exc, Exception):
                raise SeriesError(message) from exc
            raise
        else:
            if unfinished is not None:  # papermill returned, but the notebook stopped early
                os.replace(tmp, failed)
                bar.close()
                raise SeriesError(f"notebook {item.name}.ipynb did not run to the end: {unfinished}"
                                  f"\n  executed copy: {_kernel_path(failed, Path.cwd().resolve())}")
            nbformat.write(coalesce_streams(nbformat.read(tmp, as_version=4)), tmp)
            os.replace(tmp, final)
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        seconds = time.perf_counter() - t0
        runs.append(NotebookRun(item.name, final, seconds, dict(item.parameters), item.kernel))
        if progress and not bars:
            print(f"notebook {len(runs)}/{len(plan)} {item.name}: {seconds:.1f} s", file=sys.stderr, flush=True)
    bar.close()

    record = {
        "timestamp": started.isoformat(timespec="seconds"),
        "seconds": round(sum(r.seconds for r in runs), 3),
        "commit": _git(root, "rev-parse", "HEAD"),
        "dirty": (None if (status := _git(root, "status", "--porcelain")) is None else bool(status)),
        "params_file": str(params_path) if params_path else None,
        "only": only,
        "overrides": dict(overrides or {}),
        "backend": backend,
        "python": sys.version.split()[0],
        "papermill": papermill.__version__,
        "notebooks": [
            {**asdict(r), "path": _kernel_path(r.path, root), "seconds": round(r.seconds, 3)} for r in runs
        ],
    }
    series = out / SERIES_FILE
    tmp_series = series.with_suffix(".json.tmp")
    tmp_series.write_text(json.dumps(record, indent=2, default=str) + "\n")
    os.replace(tmp_series, series)
    return runs
