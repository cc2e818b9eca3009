"""The benchmark suites' case lists (andromeda_nb.bench): what ``--list`` prints, the variant names of
the committed tables, the columns, the configs; and the runs' shared logic with fake measurements.
No GPU: nothing here measures anything."""

import ast
import csv
import importlib
import importlib.util
import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from andromeda_nb.bench import harness
from andromeda_nb.provenance import COMMITTED_RESULTS

ROOT = Path(__file__).resolve().parents[2]
SUITES = harness.SUITES
FULL, QUICK = harness.Options(), harness.Options(quick=True)

#: the phases each suite had before the cases were declared as data (past sessions' notes cite them)
PHASES_BEFORE = {
    "scoring": {"design", "sync", "final", "filter", "weights", "tensor", "defaults", "bitset_sweep", "int8",
                "bitset_auto", "unfused", "dtype", "sweep", "sweep_dtypes", "dense", "access"},
    "topk": {"large", "nsweep", "elig", "small", "stages", "stages_large", "batch"},
    "targeting": {"main", "grouped", "stages", "pool", "values", "updates", "device", "layouts", "density",
                  "categories"},
    "pipeline": {"retrieve", "match", "launch", "open_loop", "score_topk"},
    "pool": {"apply", "during", "soak"},
    "serving": {"topologies", "sharded"},
}
DEFAULTS_BEFORE = {
    "scoring": {"design", "unfused", "dtype", "sweep", "dense", "access"},
    "topk": {"large", "elig", "small", "stages", "batch", "nsweep"},
    "targeting": PHASES_BEFORE["targeting"],
    "pipeline": PHASES_BEFORE["pipeline"],
    "pool": PHASES_BEFORE["pool"],
    "serving": PHASES_BEFORE["serving"],
}
#: rows a phase writes alone (full run, 10^8 ads), counted from the suites' code before the case
#: lists: a case dropped or doubled in the declarations changes these
ROWS_PER_PHASE = {
    "scoring": {"design": 15, "sync": 9, "final": 8, "filter": 13, "weights": 17, "tensor": 15, "defaults": 14,
                "bitset_sweep": 9, "int8": 10, "bitset_auto": 2, "unfused": 3, "dtype": 6, "sweep": 21,
                "sweep_dtypes": 48, "dense": 1, "access": 14, "peers": 18, "frontier": 39, "registers": 8,
                "int8_math": 16, "int8_occupancy": 15, "f16_weights": 16},
    "topk": {"large": 16, "nsweep": 9, "elig": 4, "small": 13, "stages": 8, "stages_large": 8, "batch": 7},
    "targeting": {"main": 17, "grouped": 13, "stages": 9, "pool": 3, "values": 5, "updates": 5, "device": 2,
                  "layouts": 4, "density": 2, "categories": 3},
    "pipeline": {"retrieve": 16, "match": 0, "launch": 2, "open_loop": 6, "score_topk": 2, "fp16": 16, "int8": 8,
                 "score_topk_dtypes": 4, "score_topk_f16_weights": 8,
                 "score_topk_ring": 12, "score_topk_row_scales": 6},
    "pool": {"apply": 12, "during": 4, "soak": 1},
    "serving": {"topologies": 6, "sharded": 4, "scaling": 16},
}
QUICK_ROWS_PER_PHASE = {
    "targeting": {"main": 4, "grouped": 11, "values": 2, "layouts": 2, "categories": 1},
    "pipeline": {"retrieve": 4, "launch": 0, "open_loop": 0, "score_topk": 0},
}
#: suites whose table no GPU run has written yet
NO_TABLE_YET: set = set()
#: variants the suites write that no committed table holds yet (a new name here is a decision)
NOT_YET_COMMITTED = {
    "scoring": {"triton_gated_scores_to_memory", "torch_compile_gated", "torch_eager_gated"},
    "pipeline": {"score_topk_bound_launches"},
    "topk": {"block_topk_onelaunch_warp_sync", "block_topk_batched_seeded_stage_final_warp_sync"},
    "targeting": {"match_U8_b256_segment_lists", "match_U8_stage_prep_segment", "match_U8_stage_post_segment",
                  "match_U8_stage_prep_match_segment", "match_U8_stage_all_segment", "match_batch16_U4",
                  "match_grouped_batch16_U{U}_G{G}"},
}


def planned(suite, phases=None, options=FULL):
    return harness.plan(suite, phases, options)


def all_cases(suite):
    """Every case any phase declares, in a full and in a quick run."""
    out = []
    for options in (FULL, QUICK):
        for phases in harness.suite_module(suite).cases(options).values():
            out += phases
    return out


def template_regex(name: str) -> re.Pattern:
    """A variant name with ``{placeholders}`` as a pattern (a placeholder: one word)."""
    parts = re.split(r"\{\w+\}", name)
    return re.compile(r"\w+".join(map(re.escape, parts)) + r"\Z")


def committed_variants(suite) -> set:
    path = ROOT / "data" / "results" / f"{suite}.csv"
    if suite in NO_TABLE_YET:
        assert not path.exists(), f"{suite}.csv is committed now: take {suite} out of NO_TABLE_YET"
        return set()
    with path.open() as f:
        return {r["variant"] for r in csv.DictReader(f)
                if not r["variant"].startswith("ceiling_") and not r["verified"].startswith("FAILED")}


# ------------------------------------------------------------------------------------------------
# --list
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("suite", SUITES)
def test_list_prints_every_phase_cases_and_exits_0(suite, capsys):
    module = harness.suite_module(suite)
    for options, flags in ((FULL, []), (QUICK, ["--quick"])):
        for phase in module.cases(options):
            assert harness.main([suite, "--list", "--phases", phase, "--out", "build/unused", *flags]) == 0
            out = capsys.readouterr().out.splitlines()
            cases = planned(suite, phase, options)
            assert out[0].startswith(f"{suite}: {len(cases)} cases")
            assert len(out) == 1 + len(cases)
            for line, p in zip(out[1:], cases):
                assert line.split()[0] == phase
                assert p.case.variants()[0] in line
    assert harness.main([suite, "--list"]) == 0  # the default phases
    assert capsys.readouterr().out.startswith(f"{suite}: ")


def test_list_needs_no_gpu_cupy_or_numba_cuda():
    """``python -m andromeda_nb.bench <suite> --list`` outside the simulator: exit 0, and neither
    cupy, torch nor numba.cuda imported (CI checks every case list on a machine without a GPU)."""
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    code = ("import sys\nfrom andromeda_nb.bench import harness\n"
            f"for s in {SUITES!r}:\n    assert harness.main([s, '--list', '--quick']) == 0\n"
            f"    assert harness.main([s, '--list', '--phases', ','.join(harness.suite_module(s).cases(harness.Options()))]) == 0\n"
            "bad = [m for m in ('cupy', 'torch', 'numba.cuda') if m in sys.modules]\nassert not bad, bad\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    r = subprocess.run([sys.executable, "-m", "andromeda_nb.bench", "topk", "--list", "--phases", "small"], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "block_topk_seeded_batch_path" in r.stdout, r.stderr[-2000:]


@pytest.mark.parametrize("suite", SUITES)
def test_fewer_than_ten_reps_is_refused(suite, capsys):
    with pytest.raises(SystemExit) as exc:
        harness.main([suite, "--list", "--reps", str(harness.MIN_REPS - 1)])
    assert exc.value.code == 2
    assert f"at least {harness.MIN_REPS}" in capsys.readouterr().err
    assert harness.main([suite, "--list", "--reps", str(harness.MIN_REPS)]) == 0


def test_unknown_phase_is_refused_with_the_known_ones(capsys):
    with pytest.raises(SystemExit) as exc:
        harness.main(["scoring", "--list", "--phases", "design,desing"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "desing" in err and "sweep_dtypes" in err


@pytest.mark.parametrize("args, expected", [
    (["--n-ads", "0"], "--n-ads must be positive"), (["--n-ads", "-5"], "--n-ads must be positive"),
    (["--min-n-ads", "-1"], "--min-n-ads non-negative"), (["--phases", ","], "names no phase"),
    (["--phases", ""], "names no phase"),
    (["--out", str(COMMITTED_RESULTS)], "committed tables' folder"),
    (["--out", str(COMMITTED_RESULTS) + "/../results/"], "committed tables' folder"),
])
def test_bad_run_arguments_are_refused_before_anything_runs(args, expected, capsys):
    """Sizes that measure nothing, a phase list naming none, and the committed tables' folder as
    ``--out`` (a run replaces <suite>.csv there) are refused; the default writes to build/bench."""
    committed = (COMMITTED_RESULTS / "scoring.csv").read_bytes()
    with pytest.raises(SystemExit) as exc:
        harness.main(["scoring", "--list", *args])
    assert exc.value.code == 2 and expected in capsys.readouterr().err
    assert (COMMITTED_RESULTS / "scoring.csv").read_bytes() == committed
    assert COMMITTED_RESULTS == Path(__file__).resolve().parents[2] / "data" / "results"  # this checkout's


def test_n_ads_is_refused_where_the_cases_carry_their_own_sizes(capsys):
    """The top-K suite's cases have their own sizes: ``--n-ads`` there is refused, not ignored, and
    a run without it plans the same cases as before."""
    with pytest.raises(SystemExit) as exc:
        harness.main(["topk", "--list", "--n-ads", "1000"])
    assert exc.value.code == 2 and "does not apply to the topk suite" in capsys.readouterr().err
    assert harness.main(["topk", "--list"]) == 0
    listed = capsys.readouterr().out
    assert "pools" not in listed.splitlines()[0] and len(listed.splitlines()) > 1
    assert harness.main(["scoring", "--list", "--n-ads", "1000"]) == 0
    assert "pools up to 1,000 ads" in capsys.readouterr().out


# ------------------------------------------------------------------------------------------------
# phases and variant names
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("suite", SUITES)
def test_phase_names_and_defaults_are_kept(suite):
    module = harness.suite_module(suite)
    # every phase of the earlier runs is kept (closing notes cite them); new phases may be added
    assert PHASES_BEFORE[suite] <= set(module.cases(FULL))
    assert DEFAULTS_BEFORE[suite] <= set(module.DEFAULT_PHASES)


@pytest.mark.parametrize("suite", SUITES)
def test_rows_per_phase(suite):
    for options, counts in ((FULL, ROWS_PER_PHASE[suite]), (QUICK, QUICK_ROWS_PER_PHASE.get(suite, {}))):
        for phase, want in counts.items():
            got = sum(len(p.case.variants()) for p in planned(suite, phase, options))
            assert got == want, (phase, options.quick)


@pytest.mark.parametrize("suite", SUITES)
def test_committed_variants_keep_their_names(suite):
    """Every variant of the committed table is still written by a case of some phase."""
    names = {v for c in all_cases(suite) for v in c.variants()}
    patterns = [template_regex(n) for n in names]
    lost = sorted(v for v in committed_variants(suite) if not any(p.match(v) for p in patterns))
    assert not lost


@pytest.mark.parametrize("suite", SUITES)
def test_written_variants_are_committed_names_or_declared_new(suite):
    committed = committed_variants(suite)
    new = NOT_YET_COMMITTED.get(suite, set())
    names = {v for c in all_cases(suite) for v in c.variants()}
    unknown = sorted(n for n in names if n not in new and not any(template_regex(n).match(v) for v in committed))
    assert not unknown
    assert new <= names  # the list holds no stale names


def test_variant_names_follow_the_parameters():
    """The name rules of the committed tables: a scoring name says the model, naive, fused or
    scores to memory and the filter path; a top-K name seeded, scan path, eligible."""
    from andromeda_nb.bench import scoring, topk

    for c in all_cases("scoring"):
        if isinstance(c, scoring.ScoringCase):
            naive = c.config != scoring.BEST and c.config.get("naive")
            want = (f"{c.model}_scores_to_memory" if c.k is None else
                    f"{c.model}_{'naive_' if naive else ''}fused_topk{'_filter' if c.path == 'filter' else ''}")
            assert c.variant == want and (c.path is None) == (c.k is None)
            assert (c.experts is None) == (c.model == "dot")
        elif isinstance(c, scoring.PeerCase):
            assert c.variant == {"triton": "triton_gated_scores_to_memory", "torch_eager": "torch_eager_gated",
                                 "torch_compile": "torch_compile_gated"}[c.peer]
            assert (c.block is not None) == (c.peer == "triton")
        else:
            assert c.variant == f"unfused_{c.pipeline}"
    for c in all_cases("topk"):
        if isinstance(c, topk.BlockTopKCase):
            want = ("block_topk" if c.path == "unseeded" else "block_topk_seeded") + \
                   ("_scan_path" if c.path == "scan" else "") + ("_eligible" if c.access == "bitset" else "")
            assert c.variant == want


# ------------------------------------------------------------------------------------------------
# columns and configs
# ------------------------------------------------------------------------------------------------


def test_path_math_layout_are_columns():
    for c in ("path", "math", "layout"):
        assert c in harness.EXTRA
    assert not set(harness.EXTRA) & set(harness.SCHEMA)


@pytest.mark.parametrize("suite", SUITES)
def test_case_columns_reach_the_csv(suite, tmp_path):
    """A row built from a case's columns (as the measurement functions build theirs) carries every
    column the case declares into the written CSV."""
    timing = harness.Timing(1e-3, 1e-3, 1e-3, 1e-5, 10)
    ceil = harness.Ceilings(4.0, 3.0, 3.5)
    cases = [c for c in all_cases(suite)]
    rows = [harness.row(suite, {}, ceil, timing, 1000, 4.0, None, "ok", **c.columns()) for c in cases]
    harness.write_rows(rows, tmp_path / "t.csv")
    with (tmp_path / "t.csv").open() as f:
        back = list(csv.DictReader(f))
    assert len(back) == len(cases) > 0  # a row a case, in order
    for c, r in zip(cases, back):
        for k, v in c.columns().items():
            assert r[k] == str(v), (c, k)


def test_scoring_rows_say_path_math_layout():
    from andromeda_nb.bench import scoring

    for c in all_cases("scoring"):
        cols = c.columns()
        assert cols["math"] in ("fp32", "fp16") and cols["layout"] in ("rows", "tiles")
        if isinstance(c, scoring.ScoringCase):
            assert (c.math == "fp16") == (c.config != scoring.BEST and c.config.get("math") == "fp16")
        if isinstance(c, scoring.ScoringCase):
            assert cols.get("path") == (None if c.k is None else c.path)
            assert c.path in (None, "block", "filter")
    for c in all_cases("topk"):
        if c.__class__.__name__ not in ("BaselineCase", "StagesCase", "BatchedCase"):
            assert c.columns()["path"] in ("filter", "scan", "unseeded", "batched", "onelaunch")


@pytest.mark.parametrize("suite", SUITES)
def test_every_case_config_constructs(suite):
    built = [cfg for c in all_cases(suite) for cfg in c.configs()]
    if suite not in ("pipeline", "pool", "serving"):
        assert built  # the suites that choose configurations declare them
    names = {type(cfg).__name__ for cfg in built}
    assert names <= {"KernelConfig", "TopKConfig", "MatchConfig"}


def test_a_bad_config_field_fails_before_the_gpu():
    from andromeda_nb.bench import scoring

    bad = scoring.fused("gated", config=scoring.cfg(values="some"))
    with pytest.raises(ValueError, match="values"):
        bad.configs()


# ------------------------------------------------------------------------------------------------
# planning
# ------------------------------------------------------------------------------------------------


def test_sweep_skips_the_design_case_only_when_design_runs():
    def sweep_cases(phases):
        return [p.case for p in planned("scoring", phases) if p.phase == "sweep"]

    def is_design_case(c):
        return (c.model, c.d, c.experts, c.k_experts) == ("gated", 64, 6, 2)

    assert sum(map(is_design_case, sweep_cases("sweep"))) == 1
    assert sum(map(is_design_case, sweep_cases("design,sweep"))) == 0


def test_phases_run_in_declaration_order_whatever_the_order_asked():
    a = planned("topk", "batch,small,large")
    assert [p.phase for p in a] == sorted((p.phase for p in a), key=["large", "small", "batch"].index)


def test_pool_prefixes_below_the_pool_only():
    small = harness.Options(n_ads=5_000_000)
    prefixes = [p.case.prefix for p in planned("targeting", "pool", small)]
    assert prefixes == [10**6]
    assert [p.case.prefix for p in planned("targeting", "pool")] == [10**6, 10**7, 3 * 10**7]


def test_pipeline_runs_pool_size_by_pool_size():
    plan = planned("pipeline")
    sizes = [p.case.n_ads for p in plan]
    assert sizes == sorted(sizes) and set(sizes) == {10**7, 10**8}
    assert {p.case.n_ads for p in plan if p.phase in ("launch", "open_loop")} == {10**8}
    # the live pool's cases are the pool suite's: each rebuilds its world after; the soak at 10^7
    pool = planned("pool")
    assert [(p.phase, p.case.n_ads) for p in pool] == [("apply", 10**7), ("during", 10**7), ("soak", 10**7),
                                                        ("apply", 10**8), ("during", 10**8)]
    quick = planned("pipeline", options=QUICK)
    assert {p.phase for p in quick} == {"retrieve", "fp16"} and {p.case.n_ads for p in quick} == {10**8}
    assert [p.case.batch for p in quick if p.phase == "retrieve"] == [1, 8, 32]
    assert not any(getattr(p.case, "diagnostics", False) for p in quick)


# ------------------------------------------------------------------------------------------------
# the runs' shared logic, with fake measurements
# ------------------------------------------------------------------------------------------------


def fake_row(case, seconds, ok=True):
    r = {c: "" for c in harness.SCHEMA + harness.EXTRA}
    r.update(case.columns(), seconds_median=f"{seconds:.6e}", items_per_s=f"{1 / seconds:.6e}",
             verified="ok" if ok else "FAILED: x")
    return r


def test_scoring_best_is_the_fastest_verified_design_contender(monkeypatch):
    from andromeda_nb.bench import scoring
    from andromeda_nb.score.config import DEFAULT_CONFIG

    speed = {c: s for c, s in zip(scoring.DESIGN_CONTENDERS, (5, 9, 7, 3, 1, 50, 8, 2, 4))}
    fails = {scoring.DESIGN_CONTENDERS[1]}  # the fastest CUDA-core one does not verify
    seen = []

    def measure(run, case):
        seen.append(run.config(case))
        return fake_row(case, 1 / speed.get(case.config, 1), ok=case.config not in fails)

    monkeypatch.setattr(scoring.Run, "MEASURE", {scoring.ScoringCase: measure})
    run = scoring.Run({}, None, FULL)
    later = [p for p in planned("scoring", "dtype")]
    # no design phase yet: the default configuration in the case's math (its column, fp32)
    assert run.config(later[0].case) == replace(DEFAULT_CONFIG, math=later[0].case.math) != DEFAULT_CONFIG
    for p in planned("scoring", "design") + later:
        run.measure(p)
    best = scoring.DESIGN_CONTENDERS[6].build(__import__("andromeda_nb.score.config", fromlist=["x"]).KernelConfig)
    assert run.config(later[0].case) == replace(best, math="fp32")  # naive (50) is not a contender, 9 failed
    assert seen[-1] == replace(best, math="fp32") and seen[len(scoring.DESIGN_CONTENDERS)] != best  # explicit configs stay


def test_targeting_fastest_grouped_budget_and_failures(monkeypatch):
    from andromeda_nb.bench import targeting

    seconds = {(1, 8): 5.0, (2, 4): 3.0, (4, 2): 1.0, (4, 4): 2.0}
    got = []

    def match(run, case):
        if case.shape == targeting.FASTEST_GROUPED:
            got.append((case.variant.format(U=run.fastest_grouped[1], G=run.fastest_grouped[2]),
                        run.fastest_grouped[3]))
            return []
        key = (case.words_per_thread, case.group)
        if key == (2, 8):
            raise RuntimeError("boom")
        return [fake_row(case, seconds.get(key, 9.0), ok=key != (4, 2))]  # the fastest does not verify

    monkeypatch.setattr(targeting.Run, "MEASURE", {targeting.MatchCase: match})
    run = targeting.Run({"device": "test"}, None, FULL)
    rows = [r for p in planned("targeting", "grouped") for r in run.measure(p)]
    assert run.fastest_grouped[1:] == (4, 4, targeting.GROUPED_BOUNDS[4, 4])
    assert got[0] == ("match_grouped_batch8_U4_G4", 3) and len(got) == 5
    failed = [r for r in rows if r["verified"].startswith("FAILED: RuntimeError")]
    assert [r["variant"] for r in failed] == ["match_grouped_U2_G8_b256"]
    monkeypatch.setattr(targeting, "elapsed", lambda: targeting.BUDGET_S + 1)
    assert run.measure(planned("targeting", "values")[0]) == []  # past the budget
    run.close()


# ------------------------------------------------------------------------------------------------
# the measurement code against the package it calls
# ------------------------------------------------------------------------------------------------


def _relative_imports(path: Path):
    pkg = "andromeda_nb.bench"
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = pkg.rsplit(".", node.level - 1)[0] if node.level > 1 else pkg
            yield (f"{base}.{node.module}" if node.module else base), [a.name for a in node.names], node.lineno


@pytest.mark.parametrize("module", sorted(p.name for p in (ROOT / "andromeda_nb" / "bench").glob("*.py")))
def test_every_relative_import_resolves(module):
    """The measurement functions import the package's kernels when they run (on a GPU only): every
    such import, at any depth of the module, names a module and attribute that exist."""
    for mod, names, line in _relative_imports(ROOT / "andromeda_nb" / "bench" / module):
        m = importlib.import_module(mod)
        for name in names:
            found = hasattr(m, name) or (hasattr(m, "__path__") and importlib.util.find_spec(f"{mod}.{name}"))
            assert found, f"{module}:{line}: {mod}.{name}"


def test_topk_stages_are_the_declared_ones():
    import numpy as np

    from andromeda_nb.bench import topk
    from andromeda_nb.device import launch

    n, k = 1_000_000, 1000
    stages, *_ = topk.topk_stages(launch.to_device(np.zeros(n, np.float32)), n, k)
    assert tuple(s[0] for s in stages) == topk.STAGES


def test_gpu_session_calls_the_bench_module_with_out_and_phases():
    text = (ROOT / "data" / "gpu_session.sh").read_text()
    assert 'python3 -m andromeda_nb.bench "$suite" --out "$OUT" $extra' in text
    assert harness.main(["topk", "--out", "build/x", "--phases", "small,stages", "--reps", "12", "--list"]) == 0


def test_gpu_session_packs_each_steps_logs_so_a_cut_off_command_brings_its_tables_back(tmp_path):
    """The device tool brings back 8 files of $OUT: after every step gpu_session.sh moves the logs and
    profiles into one extras.tar (appended step by step) and leaves the tables loose, so a command
    stopped by its time limit in a later step still brings back every table. (An unknown step runs
    nothing: exit 2, then the packing.)"""
    import tarfile

    out = tmp_path / "out"
    (out / "quality").mkdir(parents=True)

    def write(names):
        for name in names:
            (out / name).write_text(name)

    write([f"host_{i}.txt" for i in range(9)] + ["scoring.csv", "tuned.json", "quality/q.log", "quality/quality.csv"])
    env = {**os.environ, "OUT": str(out), "ANDROMEDA_COMMIT": "test"}

    def run():
        return subprocess.run(["bash", str(ROOT / "data" / "gpu_session.sh"), "no_such_step"], cwd=tmp_path, env=env,
                              capture_output=True, text=True)

    done = run()
    assert done.returncode == 2 and "unknown step no_such_step" in done.stdout
    left = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert left == ["extras.tar", "quality/quality.csv", "scoring.csv", "tuned.json"]
    write(["bench_pipeline.log", "pipeline.csv"])
    assert run().returncode == 2
    with tarfile.open(out / "extras.tar") as tar:
        packed = sorted(tar.getnames())
    assert packed == sorted(["./bench_pipeline.log", "./quality/q.log"] + [f"./host_{i}.txt" for i in range(9)])
    assert (out / "pipeline.csv").read_text() == "pipeline.csv" and not (out / "host_0.txt").exists()


def test_host_profiles_go_beside_the_running_suites_csv(tmp_path, monkeypatch):
    """During a bench run (its CSV sink set) every host profile is a section of
    <suite>_host_profiles.txt beside the CSV; a case called outside a run writes <out>/host_profiles.txt."""
    from andromeda_nb.bench import pipeline as P

    P._host_profile(lambda: None, 2, tmp_path, "alone")
    (tmp_path / "runs").mkdir()  # the run's --out, made by harness.main
    monkeypatch.setattr(harness, "_sink", tmp_path / "runs" / "pool.csv")
    for name in ("apply_10_20", "apply_10_40"):
        P._host_profile(lambda: sum(range(10)), 3, tmp_path / "elsewhere", name)
    assert (tmp_path / "host_profiles.txt").read_text().startswith("=== alone (2 calls)\n")
    text = (tmp_path / "runs" / "pool_host_profiles.txt").read_text()
    assert [line for line in text.splitlines() if line.startswith("===")] == ["=== apply_10_20 (3 calls)",
                                                                             "=== apply_10_40 (3 calls)"]
    assert harness.side_file(tmp_path / "pipeline.csv") == tmp_path / "pipeline_host_profiles.txt"


def test_a_serving_worker_builds_each_world_once_and_keeps_only_the_last():
    from andromeda_nb.bench import serving as S

    made = []

    def make(tag):
        made.append(tag)
        return [tag]

    S._LAST.clear()
    a = S._last("world", (1, 0), lambda: make("a"))
    assert S._last("world", (1, 0), lambda: make("again")) is a  # the same build, not a new one
    b = S._last("rules", (1, 0), lambda: make("b"))  # another kind keeps its own
    c = S._last("world", (2, 0), lambda: make("c"))  # a new key replaces the last world
    assert made == ["a", "b", "c"] and b == ["b"] and c == ["c"]
    assert S._LAST["world"] == ((2, 0), ["c"]) and S._LAST["rules"][1] is b
    S._LAST.clear()


def test_min_n_ads_leaves_out_the_smaller_pools():
    """``--min-n-ads``: a run of the largest pool alone (the serving suite at 10^8, which would
    otherwise measure 10^7 first); a case without its own size has the run's."""
    big = harness.Options(n_ads=10 ** 8, min_n_ads=10 ** 8)
    assert [p.case.n_ads for p in planned("serving", "topologies", big)] == [10 ** 8] * 3
    both = [p.case.n_ads for p in planned("serving", "topologies", harness.Options(n_ads=10 ** 8))]
    assert sorted(both) == [10 ** 7] * 3 + [10 ** 8] * 3
    assert planned("scoring", options=harness.Options(n_ads=10 ** 8, min_n_ads=10 ** 8))  # the run's size
    assert not planned("scoring", options=harness.Options(n_ads=10 ** 7, min_n_ads=10 ** 8))


def test_call_breakdown_splits_a_calls_wall_time_at_its_launches(monkeypatch):
    # events and the wall clock read one fake clock that the call advances (the stream idle, so
    # events record at host time): the breakdown's arithmetic and medians on exact, load-free times
    from types import SimpleNamespace

    from numba import cuda

    from andromeda_nb.bench import pipeline
    from andromeda_nb.score import api

    clock = [0.0]

    class HostEvent:
        def record(self):
            self.t = clock[0]

    def advance(seconds):
        clock[0] += seconds

    monkeypatch.setattr(cuda, "event", HostEvent, raising=False)
    monkeypatch.setattr(cuda, "event_elapsed_time", lambda a, b: (b.t - a.t) * 1e3, raising=False)
    monkeypatch.setattr(pipeline, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    monkeypatch.setattr(api._Replay, "run", lambda self, inputs, copy_answer=None: advance(0.03))
    pres = iter([0.02, 0.09, 0.021])  # one slow call: the medians drop it

    def call():
        advance(next(pres))
        api._Replay.run(None, {})
        advance(0.01)

    before = api._Replay.run
    parts = pipeline._call_breakdown(call, 3)
    assert parts == pytest.approx({"pre": 0.021, "launches": 0.03, "after": 0.01})
    assert api._Replay.run is before  # the marking wrapper is removed again
    assert pipeline._call_breakdown(lambda: advance(0.05), 2) == {}  # no recorded launches: no breakdown


@pytest.mark.slow  # ~40 s: the filter path's seed needs 1,000 ads, and every configuration checks its answer
def test_host_path_diagnostic_checks_its_answers():
    """bench.host_path times warm score_topk calls with the launches stubbed (every timed call
    replays), after checking each configuration's answer against the reference; the replay is
    restored after it. A table too small for the filter path's seed (the block path: nothing to
    stub) is refused before anything runs."""
    from andromeda_nb.bench import host_path
    from andromeda_nb.score import api

    run = api._Replay.run
    with pytest.raises(ValueError, match="too few ads for the filter path"):
        host_path.host_times(calls=3, repeats=1, n_ads=host_path.MIN_N_ADS - 1)
    rows = host_path.host_times(calls=3, repeats=1, n_ads=host_path.MIN_N_ADS)
    assert [(r["dtype"], r["math"]) for r in rows] == [("fp16", "auto"), ("fp16", "fp16"), ("int8", "auto"),
                                                       ("int8", "fp16")]
    assert all(r["verified"] == "ok" and r["us_per_call"] > 0 for r in rows)
    assert api._Replay.run is run


def test_the_ring_experiment_calls_score_topk_with_its_launch():
    """score_topk_ring's cases hand their launch settings to the KernelConfig of the call (not
    only to the row's name), and the phase is an experiment: named to run, not in a default run."""
    from andromeda_nb.bench import pipeline

    cases = pipeline.PHASES["score_topk_ring"]
    configs = [case.configs()[0] for case in cases]
    assert [(c.block, c.blocks_per_sm, c.ring_stages) for c in configs[2:]] == [(128, 4, r) for r in (0, 2, 3, 4)]
    assert [c.ring_stages for c in configs[:2]] == ["auto", "auto"] and [case.dtype for case in cases[:2]] == ["fp16", "int8"]
    assert "score_topk_ring" in pipeline.EXPERIMENTS and "score_topk_ring" not in pipeline.DEFAULT_PHASES
    pairs = [case.configs()[0] for case in pipeline.PHASES["score_topk_row_scales"]]
    assert [c.kernel_row_scales(case.dtype) for c, case in zip(
        [c.replaced("math", "fp16") for c in pairs], pipeline.PHASES["score_topk_row_scales"])] == [False, True, False]
    assert "score_topk_row_scales" in pipeline.EXPERIMENTS and "score_topk_row_scales" not in pipeline.DEFAULT_PHASES
    loops = [(case.dtype, case.configs()[0].loop) for case in pipeline.PHASES["score_topk_loop"]]
    assert loops == [("fp16", "auto"), ("fp16", "checked"), ("int8", "auto"), ("int8", "checked")]
    assert "score_topk_loop" in pipeline.EXPERIMENTS and "score_topk_loop" not in pipeline.DEFAULT_PHASES
    graphs = [(case.dtype, case.variants()) for case in pipeline.PHASES["score_topk_graph"]]
    assert graphs == [(dt, (v,)) for dt in ("fp16", "int8") for v in ("score_topk", "score_topk_bound_launches")]
    assert "score_topk_graph" in pipeline.EXPERIMENTS and "score_topk_graph" not in pipeline.DEFAULT_PHASES


def test_the_profile_script_launches_its_four_cases():
    """data/profile_scores.py (gpu_session.sh's ncu step) on a small table in the simulator: one
    line a case, each with finite scores, so a GPU call never profiles a broken script."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))  # the wheelhouse kept
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", PYTHONPATH=path)
    r = subprocess.run([sys.executable, str(ROOT / "data" / "profile_scores.py"), "100"], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.splitlines() == [f"{dt} {label}: scores finite: True" for dt, label in (
        ("fp16", "default"), ("int8", "default"), ("int8", "ring_stages=3"), ("int8", "ring_stages=2"))]
    assert "profile_scores.py" in (ROOT / "data" / "gpu_session.sh").read_text()


def test_every_experiment_setting_keeps_its_rows_out_of_the_headlines():
    """A scoring row's notes name each launch setting off the default (config_note), and the
    results' EXPERIMENT pattern catches every one of them, so an experiment's row never becomes a
    headline or a report's default; the default launch's notes match none."""
    from andromeda_nb.analysis import results
    from andromeda_nb.bench.scoring import config_note
    from andromeda_nb.score import KernelConfig

    base = KernelConfig(math="fp16", dequant="fma")
    assert not any(re.search(results.EXPERIMENT, config_note(base, dt)) for dt in ("fp16", "int8"))
    assert config_note(base.replaced("loop", "split"), "int8") == config_note(base, "int8")  # the default's kernel
    assert "fp16 pairs" in config_note(base, "int8") and "pairs" not in config_note(base, "fp16")
    # the widening of int8 rows is named only where the kernel widens them
    assert "dequant=fma" in config_note(base, "int8") and "dequant" not in config_note(base.replaced("dequant", "mul"), "fp16")
    assert "dequant" not in config_note(KernelConfig(dequant="mul"), "int8")  # fp32 math reads int8 rows as fp32
    for field, value in (("tile_order", "steps"), ("f16_weights", "shared"), ("rows_ahead", 2), ("ring_stages", 3),
                         ("row_scales", "fp16_pairs"), ("row_scales", "fp32"), ("blocks_per_sm", 5),
                         ("loop", "checked")):
        note = config_note(base.replaced(field, value), "int8")
        assert re.search(results.EXPERIMENT, note), (field, note)
