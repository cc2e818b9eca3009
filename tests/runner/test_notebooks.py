"""Every notebook runs end to end under papermill with the smoke parameters (tiny sizes, simulator)."""

import json

import pytest

from andromeda_nb.runner.series import find_notebooks, run_series

pytestmark = pytest.mark.notebook


def test_series_runs_with_smoke_parameters(tmp_path):
    out, figs = tmp_path / "nb", tmp_path / "figures"
    runs = run_series(params="smoke", out_dir=out, figures_dir=figs, progress=False)
    names = [r.name for r in runs]
    assert names == [p.stem for p in find_notebooks("notebooks")]
    assert (out / "series.json").exists()
    for name in names:
        assert (out / f"{name}.ipynb").exists()
    quick = json.loads((out / "metrics" / "01_quickstart.json").read_text())
    assert quick["all_answers_match_oracle"] is True and quick["users_run_on_device"] >= 1
    assert 0.0 <= quick["recall@10_device"] <= 1.0
    assert (figs / "quickstart_recall.png").exists() and (figs / "quickstart_recall.svg").exists()
