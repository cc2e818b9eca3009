"""The committed notebooks: thin (parameters declared once, computation in the package), and under
the smoke parameters every one runs end to end and records headline metrics within their expected
ranges (tiny sizes, the simulator; the measurement notebooks plot the committed GPU rows)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import nbformat
import numpy as np
import pytest
from filelock import FileLock

from andromeda_nb.analysis import quality
from andromeda_nb.runner.notebook import parameters_cell
from andromeda_nb.runner.series import find_notebooks, load_params_file, resolve_params_file, run_series

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = find_notebooks(REPO / "notebooks")
#: Most code lines a notebook may hold outside its parameters cell (blank lines, comments and
#: imports not counted): the computation belongs in andromeda_nb.analysis.
MAX_LOGIC_LINES = 40
#: The figures each notebook writes (PNG and SVG).
FIGURES = {
    "01_quickstart": ["quickstart_recall"],
    "02_scoring": ["scoring_byte_budget", "scoring_network_bytes", "scoring_complexity", "scoring_peers", "scoring_frontier", "scoring_fusion_cost",
                   "scoring_roofline"],
    "03_topk": ["topk_throughput", "topk_stages", "topk_scaling"],
    "04_targeting": ["targeting_byte_model", "targeting_throughput", "targeting_gpu_vs_cpu", "targeting_updates",
                     "targeting_memory", "targeting_layouts"],
    "05_expert_count": ["expert_count_recall_vs_compute", "expert_count_worked_example"],
    "06_precision": ["precision_quality_vs_throughput"],
    "07_request_path": ["pipeline_batches", "pipeline_steps", "pipeline_load", "pool_apply"],
    "08_serving": ["serving_bytes", "serving_scaling"],
}


def code_cells(path: Path):
    return [c for c in nbformat.read(str(path), as_version=4).cells if c.cell_type == "code"]


def logic_lines(path: Path) -> int:
    n = 0
    for cell in code_cells(path):
        if "parameters" in cell.metadata.get("tags", []):
            continue
        for line in cell.source.splitlines():
            text = line.strip()
            if text and not text.startswith(("#", "import ", "from ")):
                n += 1
    return n


# ------------------------------------------------------------------------------------------------
# the committed notebooks (no kernel starts)


def test_notebooks_are_numbered_without_gaps():
    numbers = [int(p.stem.split("_")[0]) for p in NOTEBOOKS]
    assert numbers == list(range(1, len(NOTEBOOKS) + 1)), [p.stem for p in NOTEBOOKS]
    assert set(FIGURES) <= {p.stem for p in NOTEBOOKS}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_thin_and_committed_without_outputs(path):
    cells = code_cells(path)
    assert logic_lines(path) <= MAX_LOGIC_LINES, f"{path.name}: {logic_lines(path)} lines of logic"
    for cell in cells:
        assert not cell.get("outputs") and cell.get("execution_count") is None, f"{path.name} has outputs"
        assert not re.search(r"^\s*(def|class|lambda)\b|\blambda\b", cell.source, re.M), (
            f"{path.name} defines a function in a cell: move it to andromeda_nb.analysis")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_parameters_are_declared_once_and_checked_in_the_next_cell(path):
    declared = parameters_cell(path)  # literals only, annotated where None is allowed
    assert {"figures_dir", "metrics_dir"} <= set(declared)
    cells = code_cells(path)
    index = next(i for i, c in enumerate(cells) if "parameters" in c.metadata.get("tags", []))
    assert f'check_parameters(globals(), "{path.stem}")' in cells[index + 1].source
    # no parameter list repeated after the declaration
    for cell in cells[index + 1:]:
        assert "validate_params" not in cell.source and "defaults=dict(" not in cell.source


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_prose_names_no_commit(path):
    """Provenance comes from the result rows at run time, never typed into the prose."""
    nb = nbformat.read(str(path), as_version=4)
    for cell in nb.cells:
        words = re.findall(r"\b[0-9a-f]{7,40}\b", cell.source)
        hashes = [w for w in words if re.search(r"\d", w) and re.search(r"[a-f]", w)]
        assert not hashes, f"{path.name}: {hashes}"
        assert "DESIGN.md" not in cell.source, f"{path.name} cites a file outside the repository"


def test_presets_hold_a_section_per_notebook_with_parameters_it_declares():
    for preset in ("default", "smoke", "full"):
        sections = load_params_file(resolve_params_file(preset, REPO / "notebooks"))
        for name, body in sections.items():
            if name != "common":
                assert set(body) <= set(parameters_cell(REPO / "notebooks" / f"{name}.ipynb")), (preset, name)


# ------------------------------------------------------------------------------------------------
# the smoke series (one run shared by the tests below)


@pytest.fixture(scope="session")
def smoke(tmp_path_factory):
    """The smoke series, run once per test session: under xdist the first worker to get here runs
    it into the directory all workers share (a file lock), the others read what it wrote (a worker
    whose queue runs dry tears its fixtures down, so a worker-local fixture could run it twice)."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent
    out = root / "smoke_series"
    with FileLock(str(root / "smoke_series.lock")):
        if not (out / "parameters.json").exists():
            runs = run_series(notebooks_dir=REPO / "notebooks", params="smoke", out_dir=out / "nb",
                              figures_dir=out / "figures", progress=False)
            (out / "parameters.json").write_text(json.dumps({r.name: r.parameters for r in runs}, default=str))
    params = json.loads((out / "parameters.json").read_text())
    return out, list(params), params


def metrics(smoke, name: str) -> dict:
    return json.loads((smoke[0] / "nb" / "metrics" / f"{name}.json").read_text())


@pytest.mark.notebook
def test_series_runs_every_notebook_and_writes_every_figure(smoke):
    out, names, _ = smoke
    assert names == [p.stem for p in NOTEBOOKS]
    assert (out / "nb" / "series.json").exists()
    for name, figures in FIGURES.items():
        assert (out / "nb" / f"{name}.ipynb").exists()
        for fig in figures:
            for ext in ("png", "svg"):
                assert (out / "figures" / f"{fig}.{ext}").stat().st_size > 0, f"{name}: {fig}.{ext}"


@pytest.mark.notebook
@pytest.mark.parametrize("name", [p.stem for p in NOTEBOOKS])
def test_findings_are_computed_markdown(smoke, name):
    """Each notebook ends its analysis with a Markdown display built from the numbers."""
    nb = nbformat.read(str(smoke[0] / "nb" / f"{name}.ipynb"), as_version=4)
    shown = [o["data"]["text/markdown"] for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
             if "text/markdown" in o.get("data", {})]
    assert shown and all(re.search(r"\d", md) for md in shown), name
    # the reports' fallbacks (no committed rows, nothing verified) hold digits too ("10^8"): none may show
    assert not any(re.search(r"committed yet|No verified", md) for md in shown), name


@pytest.mark.notebook
def test_quickstart_answers_match_the_oracle(smoke):
    m = metrics(smoke, "01_quickstart")
    ks = smoke[2]["01_quickstart"]["ks"]
    assert m["all_answers_match_oracle"] is True
    assert m["users_run_on_device"] == smoke[2]["01_quickstart"]["n_users"]
    assert 0.0 < m["heldout_passing_targeting_mean"] <= 1.0
    for k in ks:
        assert 0.0 <= m[f"recall@{k}_device"] <= 1.0 and 0.0 < m[f"recall@{k}_oracle_all_users"] <= 1.0
        # the same answers up to near-ties: the same recall within one held-out item in 20
        assert m[f"recall@{k}_device"] == pytest.approx(m[f"recall@{k}_oracle_same_users"], abs=0.05)
    assert m[f"recall@{ks[0]}_oracle_all_users"] <= m[f"recall@{ks[-1]}_oracle_all_users"]


@pytest.mark.notebook
def test_scoring_headlines(smoke):
    m = metrics(smoke, "02_scoring")
    assert m["fused_over_unfused_per_op_pool"] > 1 and m["fused_over_unfused_pre_fusion_candidates"] > 1
    assert m["gated_over_dot_time_scores_to_memory"] >= 1  # the gate costs time, never saves it
    for key in ("gated_fused_filter_k1000_over_scoring_alone", "dot_fused_filter_k1000_over_scoring_alone"):
        assert 0.5 < m[key] < 1.5
    bitset = {k: v for k, v in m.items() if k.startswith("bitset_")}
    assert bitset and all(0 < v <= 1 for v in bitset.values())
    assert m["bitset_0.01_best_of_fastest_pool_time"] <= m["bitset_0.5_best_of_fastest_pool_time"]


@pytest.mark.notebook
def test_topk_headlines(smoke):
    m = metrics(smoke, "03_topk")
    assert m["demo_matches_oracle"] is True
    assert m["topk_100M_k1000_over_torch"] > 1
    assert 0 < m["topk_100M_k1000_fraction_of_read_ceiling"] <= 1


@pytest.mark.notebook
def test_targeting_headlines(smoke):
    m, p = metrics(smoke, "04_targeting"), smoke[2]["04_targeting"]
    assert m["all_checks_match_oracle"] is True
    assert m["device_checks_passed"] == p["check_profiles"] + p["check_batches"]
    assert 0 < m["model_eligible_fraction"] <= 1
    assert 0 < m["model_row_bits_per_ad_default"] < 64 and m["model_bytes_per_ad_default"] > 0
    assert 0 < m["measured_fraction_of_read_ceiling"] <= 1 and m["all_rows_verified"] is True
    assert m["gpu_over_cpu"] > 1 and m["updates_per_s_gpu"] > 0 and m["index_GB_default_at_1e8"] > 0


@pytest.mark.notebook
def test_expert_count_headlines(smoke):
    m, p = metrics(smoke, "05_expert_count"), smoke[2]["05_expert_count"]
    assert m["kernel_matches_torch_topk"] is True and m["kernel_users_checked"] == p["check_users"]
    for ds in ("multi_interest", "ml-100k"):
        models = {k.split("/")[1]: v for k, v in m.items() if k.startswith(f"{ds}/")}
        assert set(quality.RETRIEVAL_MODELS) | {"ranking"} <= set(models), ds
        assert all(0 <= v <= 1 for v in models.values())
    truth = m["multi_interest/true_model/recall@100"]
    assert all(truth >= m[f"multi_interest/{model}/recall@100"] for model in quality.RETRIEVAL_MODELS)


@pytest.mark.notebook
def test_precision_headlines(smoke):
    m, p = metrics(smoke, "06_precision"), smoke[2]["06_precision"]
    assert m["kernel_matches_torch_topk_all_dtypes"] is True
    assert m["kernel_dtypes_checked"] == ["bf16", "fp16", "fp32", "int8"]
    for ds in p["datasets"]:
        assert m[f"{ds}/fp32/recall@100_delta_pp"] == 0 and m[f"{ds}/fp32/overlap@100_fp32"] == 1
        for dt in ("bf16", "fp16", "int8", "int8_dimscale"):
            ov, delta = m[f"{ds}/{dt}/overlap@100_fp32"], m[f"{ds}/{dt}/recall@100_delta_pp"]
            assert 0.9 < ov <= 1 and np.isfinite(delta)
            assert ov < 1 or delta == 0  # the same top-100s retrieve the same held-out clicks


@pytest.mark.notebook
def test_serving_headlines(smoke):
    """Every topology answered as the in-process pool; remote scoring moved more bytes than
    co-location on the wire; the byte model puts the 10^8-ad ratio past the source's ~100x."""
    m = metrics(smoke, "08_serving")
    assert m["all_equal_to_in_process"] is True
    assert 0 < m["colocated_bytes_per_request"] < m["remote_bytes_per_request"]
    assert m["model_ratio_1e8_1pct"] > 100


@pytest.mark.notebook
def test_request_path_headlines(smoke):
    m = metrics(smoke, "07_request_path")
    assert m["demo_matches_reference"] is True and m["all_rows_verified"] is True
    assert 0 < m["retrieve_1e8_device_ms"] < m["retrieve_1e8_p50_ms"] <= m["retrieve_1e8_p99_ms"]
    assert m["retrieve_1e8_wall_over_device"] >= 1 and m["retrieve_1e8_batch32_requests_per_s"] > 0
    assert 0 < m["score_topk_1e8_device_over_wall"] <= 1 and m["score_sparse_1e8_device_us"] > 0
    applied = {k: v for k, v in m.items() if k.startswith("apply_batch") and k.endswith("_updates_per_s")
               and "device" not in k}
    assert set(applied) == {f"apply_batch{b}_updates_per_s" for b in (1000, 10000, 100000)}
    assert all(v > 0 for v in applied.values())
    # a slot holds its fp16 d64 row (128 bytes), bias and ad id, and its index bits
    assert 128 + 4 + 8 < m["memory_bytes_per_ad"] < 1024
