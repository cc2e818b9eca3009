"""Every notebook figure drawn from the committed result tables: one style, a source note, and a
label on both axes of every panel with data (units where a quantity has one)."""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from andromeda_nb.analysis import (expert_count_report, plots, precision_report, quality, results,  # noqa: E402
                                   scoring_figures, scoring_report, targeting_report, topk_report)

RESULTS = Path(__file__).resolve().parents[2] / "data" / "results"


def scoring_figures_():
    m = results.measurements("scoring", RESULTS)
    d, dt, E, K = 64, "fp16", 6, 2
    fuse, run = scoring_report.fusion_cost(m.rows, d, dt, E, K)
    return [scoring_figures.byte_budget(scoring_report.byte_budget(d, dt, E, K), d, dt, E, K),
            scoring_figures.network_bytes(scoring_report.network_bytes(d, dt), d, dt),
            scoring_figures.complexity(scoring_report.complexity_sweep(m.rows, d, dt),
                                       scoring_report.by_d_and_dtype(m.rows, E, K), m.path, d, dt, E, K),
            scoring_figures.fusion_cost(fuse, run, m.path, d, dt),
            scoring_figures.frontier(*scoring_report.frontier(m.rows, dt), m.path),
            scoring_figures.roofline(m.rows, m.path)]


def topk_figures():
    m = results.measurements("topk", RESULTS)
    return [topk_report.throughput_figure(topk_report.throughput_pivot(m.rows), m.source),
            topk_report.stages_figure(topk_report.stage_table(m.rows), m.source),
            topk_report.scaling_figure(topk_report.scaling(m.rows), m.read_TBps, m.source)]


def targeting_figures():
    m = targeting_report.measurements(RESULTS)
    mem, source = targeting_report.memory(RESULTS, None, 0)
    return [targeting_report.throughput_figure(m.rows, m.read_TBps, m.source),
            targeting_report.gpu_vs_cpu_figure(targeting_report.kernel_shapes(m.rows), m.source),
            targeting_report.updates_figure(m.rows, m.source),
            targeting_report.layouts_figure(m.rows, m.source),
            targeting_report.memory_figure(mem, source)]


def quality_figures():
    frame, source, _ = quality.committed(RESULTS / "quality.csv")
    datasets = list(quality.DATASETS)
    tables = expert_count_report.recall_tables(frame, datasets)
    prec, _ = precision_report.load(False, RESULTS / "quality.csv", "full", datasets)
    thr = precision_report.throughput(RESULTS / "scoring.csv")
    return [expert_count_report.recall_vs_compute_figure(frame, tables, source),
            precision_report.figure(precision_report.summaries(prec, datasets), thr, source)]


def _is_name(tick: str) -> bool:
    text = tick.replace("\N{MINUS SIGN}", "-").replace("$", "").replace("\\mathdefault{", "").replace("}", "")
    try:
        float(text.replace("^", "e").replace("{", "").replace("10e", "1e"))
        return False
    except ValueError:
        return True


@pytest.mark.parametrize("make", [scoring_figures_, topk_figures, targeting_figures, quality_figures],
                         ids=lambda f: f.__name__.rstrip("_"))
def test_figures_are_labelled_and_sourced(make):
    plots.use_style()
    try:
        for fig in make():
            notes = [t.get_text() for t in fig.texts if t.get_gid() == plots.NOTE_GID]
            assert notes and notes[0], "no source note"
            fig.canvas.draw()  # tick labels exist after a draw
            for ax in fig.axes:
                if ax.get_label() == "<colorbar>" or not (ax.lines or ax.patches or ax.collections or ax.images):
                    continue
                for axis, label in ((ax.xaxis, ax.get_xlabel()), (ax.yaxis, ax.get_ylabel())):
                    # an unlabelled axis must be categorical: its ticks name things, they are no numbers
                    ticks = [t.get_text() for t in axis.get_ticklabels() if t.get_text()]
                    assert label or not ticks or any(_is_name(t) for t in ticks), (
                        f"{ax.get_title()!r}: an unlabelled numeric axis {ticks[:3]}")
    finally:
        plt.close("all")
