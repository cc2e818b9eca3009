"""IPython extension the series runner loads into each notebook's kernel: text progress bars.

In a Jupyter kernel ``tqdm.auto`` draws its bars as ipywidgets, which JupyterLab shows live. An
executed copy written by papermill keeps only a reference to a widget that no longer exists, so a
reader sees ``HBox(children=...)`` or nothing at all. The runner therefore starts each kernel with
``--ext andromeda_nb.runner.text_progress``: before any cell runs, ``tqdm.auto`` (and
``tqdm.autonotebook``, which it re-exports) hand out tqdm's text bars, the ones a terminal shows,
and the executed copy keeps the bar's last state as text. JupyterLab does not load this extension,
so there the same calls draw widgets.
"""

from __future__ import annotations

import warnings


def use_text_progress_bars() -> None:
    """Make ``tqdm.auto``'s ``tqdm`` / ``trange`` what they are outside Jupyter (text bars that
    also iterate asynchronously, ``tqdm.asyncio``), and ``tqdm.autonotebook``'s tqdm's plain text
    bars.

    Affects the modules that import them afterwards: the kernel extension calls it at kernel
    start, before any cell imports the package.
    """
    import tqdm.asyncio
    import tqdm.std

    with warnings.catch_warnings():
        # without ipywidgets, tqdm.autonotebook warns "IProgress not found" when first imported
        warnings.simplefilter("ignore")
        import tqdm.auto
        import tqdm.autonotebook
    tqdm.auto.tqdm, tqdm.auto.trange = tqdm.asyncio.tqdm, tqdm.asyncio.trange
    tqdm.autonotebook.tqdm, tqdm.autonotebook.trange = tqdm.std.tqdm, tqdm.std.trange


def load_ipython_extension(ipython) -> None:  # noqa: ARG001 - IPython's extension protocol
    """IPython's entry point (``--ext andromeda_nb.runner.text_progress``)."""
    use_text_progress_bars()
