"""One figure style and one way to save figures (PNG + SVG, deterministic bytes).

Usage in a notebook::

    from andromeda_nb.analysis import plots
    plots.use_style()
    fig, ax = plt.subplots()
    ...
    plots.source_note(fig, "measured on NVIDIA H200, data/results/scoring.csv")
    plots.save_figure(fig, "scoring_throughput", out_dir=figures_dir)

Outside Jupyter and without a display (a batch job, CI) this module selects matplotlib's Agg
backend on import, unless a backend was chosen already (``MPLBACKEND`` or pyplot imported). Inside
a Jupyter kernel it leaves the inline backend alone.
"""

from __future__ import annotations

import os
import sys
from importlib import resources
from pathlib import Path
from typing import Iterable

import matplotlib as mpl


def _headless() -> bool:
    if "ipykernel" in sys.modules or os.environ.get("MPLBACKEND"):
        return False
    if "matplotlib.pyplot" in sys.modules:  # a backend is (about to be) in use; do not switch it
        return False
    if sys.platform.startswith(("linux", "freebsd")):
        return not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))
    return False


if _headless():
    mpl.use("Agg")

STYLE_NAME = "andromeda.mplstyle"
#: Salt for SVG element ids, so the same figure always gives the same SVG bytes.
SVG_HASHSALT = "andromeda-nb"
#: Metadata that would make two saves of one figure differ (timestamps), removed per format.
_STABLE_METADATA = {"svg": {"Date": None}, "pdf": {"CreationDate": None, "ModDate": None}, "png": {}}
NOTE_GID = "andromeda-source-note"
#: The style's colour cycle (andromeda.mplstyle): Okabe-Ito, safe for the common colour-vision
#: deficiencies, yellow last (hard to see on white).
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#000000", "#F0E442")


def style_path() -> Path:
    """Path of the packaged ``andromeda.mplstyle``."""
    return Path(str(resources.files("andromeda_nb.analysis") / STYLE_NAME))


def use_style() -> None:
    """Apply the packaged style (Okabe-Ito colour-blind-safe palette, light grid, write-up sizes)
    to matplotlib's global rcParams.

    Raises:
        FileNotFoundError: the style file is missing from the installed package.
    """
    path = style_path()
    if not path.is_file():
        raise FileNotFoundError(f"{STYLE_NAME} is not installed next to andromeda_nb ({path})")
    import matplotlib.pyplot as plt

    plt.style.use(str(path))


def save_figure(
    fig,
    name: str,
    out_dir: str | os.PathLike = "figures",
    formats: Iterable[str] = ("png", "svg"),
    dpi: int = 200,
    note: str | None = None,
) -> list[Path]:
    """Write ``fig`` as ``<out_dir>/<name>.<fmt>`` for each format, with a tight bounding box and
    no timestamps, so saving the same figure twice gives the same bytes.

    Args:
        fig: a matplotlib Figure.
        name: file stem, e.g. ``"scoring_throughput"`` (no extension, no folder).
        out_dir: folder, created when missing.
        formats: any of ``"png"``, ``"svg"``, ``"pdf"``.
        dpi: resolution of raster output.
        note: where the numbers come from, put under the figure first (:func:`source_note`).

    Returns:
        The paths written, in the order of ``formats``.

    Raises:
        ValueError: empty or path-like ``name``, a ``name`` ending in a format's extension, an
            unsupported format, or no format.
    """
    formats = [f.lower().lstrip(".") for f in ([formats] if isinstance(formats, str) else formats)]
    if not formats:
        raise ValueError("save_figure: no formats given")
    bad = [f for f in formats if f not in _STABLE_METADATA]
    if bad:
        raise ValueError(f"save_figure: unsupported format(s) {bad}; use {sorted(_STABLE_METADATA)}")
    if not name or name != Path(name).name or name in (".", ".."):
        raise ValueError(f"save_figure: name must be a plain file stem, got {name!r}")
    if Path(name).suffix.lower().lstrip(".") in _STABLE_METADATA:
        raise ValueError(f"save_figure: pass the name without extension ({Path(name).stem!r}), formats= picks them")
    if note is not None:
        source_note(fig, note)
    folder = Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    with mpl.rc_context({"svg.hashsalt": SVG_HASHSALT}):
        for fmt in formats:
            path = folder / f"{name}.{fmt}"
            fig.savefig(path, format=fmt, dpi=dpi, bbox_inches="tight", metadata=dict(_STABLE_METADATA[fmt]))
            paths.append(path)
    return paths


#: Past eight categories: these palette colours mixed half with white, the ones least like any
#: palette colour first (the blue's tint is close to the sky blue, the orange's to the yellow).
_TINTED = ("#D55E00", "#009E73", "#CC79A7", "#000000", "#E69F00", "#0072B2", "#56B4E9", "#F0E442")


def categorical_colors(n: int) -> list[str]:
    """``n`` colours for ``n`` categories in the style's palette: :data:`PALETTE` itself up to
    eight, then tints of its colours (:data:`_TINTED`), then the sixteen again."""
    from matplotlib.colors import to_hex, to_rgb

    tints = [to_hex([(c + 1.0) / 2 for c in to_rgb(p)]) for p in _TINTED]
    both = [p.lower() for p in PALETTE] + tints
    return [both[i % len(both)] for i in range(n)]


def color_map(names: Iterable[str]) -> dict[str, str]:
    """``{name: colour}`` from :func:`categorical_colors`, in the order given: one colour a
    category, the same in every figure that maps the same names."""
    names = list(names)
    return dict(zip(names, categorical_colors(len(names))))


def legend_outside(ax, **kwargs):
    """The legend to the right of ``ax``, centred, at the style's size: for legends that would
    cover data inside the axes. Keyword arguments go to ``ax.legend``."""
    return ax.legend(**{"loc": "center left", "bbox_to_anchor": (1.01, 0.5), **kwargs})


def source_note(fig, text: str):
    """Put a small grey note under the bottom-left corner of ``fig`` stating where its numbers come
    from, e.g. ``"measured on NVIDIA H200, data/results/scoring.csv"`` or ``"simulator run:
    correctness only, not a speed figure"``. Calling it again replaces the note.

    The note sits just below the figure area; saves with ``bbox_inches="tight"`` (as
    :func:`save_figure` and Jupyter's inline display do) grow the image to include it.

    Returns:
        The matplotlib Text artist.
    """
    from matplotlib.transforms import ScaledTranslation

    for old in [t for t in fig.texts if t.get_gid() == NOTE_GID]:
        old.remove()
    offset = ScaledTranslation(0, -4 / 72, fig.dpi_scale_trans)  # 4 pt below the figure's edge
    return fig.text(
        0.0, 0.0, text, transform=fig.transFigure + offset, ha="left", va="top",
        fontsize="x-small", color="0.45", gid=NOTE_GID,
    )


def no_data(ax, message: str) -> None:
    """Say in an empty panel why it is empty (e.g. no committed rows for the configuration asked
    for), instead of drawing nothing."""
    ax.text(0.5, 0.5, message, ha="center", va="center", transform=ax.transAxes, fontsize="small", color="0.35",
            wrap=True)
    ax.set_xticks([])
    ax.set_yticks([])
