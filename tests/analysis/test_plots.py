"""plots: packaged style, deterministic save_figure, source note."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from andromeda_nb.analysis import plots  # noqa: E402


def make_figure(note: str | None = None):
    fig, ax = plt.subplots()
    ax.plot([1, 2, 3, 4], [1.0, 4.0, 2.0, 8.0], marker="o", label="gated E=6 K=2")
    ax.fill_between([1, 2, 3, 4], [0.5, 3, 1, 7], [1.5, 5, 3, 9], alpha=0.2)  # uses a clip path id
    ax.set_xlabel("ads (millions)")
    ax.set_ylabel("G ads/s")
    ax.set_title("throughput")
    ax.legend()
    if note:
        plots.source_note(fig, note)
    return fig


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def test_style_is_packaged_and_applied():
    assert plots.style_path().is_file()
    with matplotlib.rc_context():
        matplotlib.rcParams["axes.grid"] = False
        plots.use_style()
        assert matplotlib.rcParams["axes.grid"] is True
        colors = matplotlib.rcParams["axes.prop_cycle"].by_key()["color"]
        assert colors[:3] == ["#0072B2", "#E69F00", "#009E73"]  # Okabe-Ito
        assert matplotlib.rcParams["savefig.dpi"] == 200


def test_save_figure_writes_png_and_svg(tmp_path):
    fig = make_figure()
    out = tmp_path / "new" / "dir"
    paths = plots.save_figure(fig, "throughput", out_dir=out)
    assert paths == [out / "throughput.png", out / "throughput.svg"]
    assert paths[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    svg = paths[1].read_text()
    assert svg.lstrip().startswith("<?xml") and "<svg" in svg
    assert "<dc:date>" not in svg  # no timestamp


def test_same_figure_saves_byte_identical(tmp_path):
    fig = make_figure("simulator run: correctness only, not a speed figure")
    a = plots.save_figure(fig, "a", out_dir=tmp_path)
    b = plots.save_figure(fig, "b", out_dir=tmp_path)
    assert a[1].read_bytes() == b[1].read_bytes()
    assert a[0].read_bytes() == b[0].read_bytes()
    # and a freshly built identical figure too (what a re-run of a notebook produces)
    c = plots.save_figure(make_figure("simulator run: correctness only, not a speed figure"), "c", out_dir=tmp_path)
    assert c[1].read_bytes() == a[1].read_bytes()


def test_save_figure_rejects_bad_names_and_formats(tmp_path):
    fig = make_figure()
    with pytest.raises(ValueError, match="without extension"):
        plots.save_figure(fig, "x.png", out_dir=tmp_path)
    with pytest.raises(ValueError, match="plain file stem"):
        plots.save_figure(fig, "sub/x", out_dir=tmp_path)
    with pytest.raises(ValueError, match="unsupported"):
        plots.save_figure(fig, "x", out_dir=tmp_path, formats=("jpg",))
    assert list(tmp_path.iterdir()) == []


def test_source_note_below_axes_replaced_not_stacked(tmp_path):
    fig = make_figure()
    renderer = fig.canvas.get_renderer()
    bottom_before = fig.get_tightbbox(renderer).y0
    plots.source_note(fig, "first")
    text = plots.source_note(fig, "measured on NVIDIA H200, data/results/scoring.csv")
    notes = [t for t in fig.texts if t.get_gid() == plots.NOTE_GID]
    assert notes == [text] and text.get_text().startswith("measured on NVIDIA H200")
    assert fig.get_tightbbox(renderer).y0 < bottom_before  # the saved image grows to include it
    # with the note the tight PNG is taller than without
    with_note = plots.save_figure(fig, "n", out_dir=tmp_path, formats=("png",))[0]
    without = plots.save_figure(make_figure(), "m", out_dir=tmp_path, formats=("png",))[0]
    assert _png_height(with_note) > _png_height(without)


def _png_height(path) -> int:
    data = path.read_bytes()
    return int.from_bytes(data[20:24], "big")  # IHDR height
