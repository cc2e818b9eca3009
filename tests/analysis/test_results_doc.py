"""docs/results.md's derived columns: how int8 rows were dequantized and a row's launch settings."""

import pandas as pd
import pytest

from andromeda_nb.analysis.results_doc import _dequant, _launch


def _rows(notes, dtype="int8", math="fp16"):
    return pd.DataFrame({"dtype": [dtype] * len(notes), "math": [math] * len(notes), "notes": notes})


def test_dequant_reads_the_notes_and_leaves_unsaid_rows_to_the_suite():
    rows = _rows(["block=256; dequant=fma (one HFMA2)", "x; dequant=mul", "no word of it"])
    assert list(_dequant(rows, "mul")) == ["fma", "mul", "mul"]
    assert list(_dequant(rows, "")) == ["fma", "mul", ""]
    assert list(_dequant(_rows(["dequant=fma"], dtype="fp16"))) == [""]  # only int8 rows in fp16 math
    assert list(_dequant(_rows(["dequant=fma"], math="fp32"))) == [""]


def test_launch_keeps_only_the_launch_settings():
    rows = _rows(["values=chosen block=128 items=1 maxreg=96 blocks/SM=5 math=fp16 (mma); scores",
                  "weights=param guard=offset;", "device: the same launches",
                  "block=256 maxreg=128 math=fp16 (mma) dequant=fma (one HFMA2) f16_weights=shared; scores",
                  "block=256 maxreg=128 math=fp16 (mma) loop=checked; scores"])
    assert list(_launch(rows)) == ["block=128 maxreg=96 blocks/SM=5", "weights=param guard=offset", "",
                                   "block=256 maxreg=128 f16_weights=shared", "block=256 maxreg=128 loop=checked"]


def test_launch_of_rows_without_notes():
    assert list(_launch(_rows([float("nan"), float("nan")]))) == ["", ""]
    assert list(_launch(pd.DataFrame({"dtype": ["fp16"]}))) == [""]


def test_a_headline_never_takes_an_experiments_row():
    """The newest verified row of a case, among the default launches: a row the tile-order
    experiment wrote later (its notes say so) is history only."""
    from andromeda_nb.analysis.results_doc import _pick

    df = pd.DataFrame({"ok": [True, True, True], "variant": ["v", "v", "v"], "timestamp": ["1", "2", "3"],
                       "notes": ["block=256", "block=256 tile_order=steps", float("nan")],
                       "items_per_s": [1.0, 9.0, 2.0]})
    df.loc[2, "ok"] = False
    assert _pick(df, {"variant": "v"})["timestamp"] == "1"


def test_a_headline_keeps_the_reference_device_and_skips_every_experiment():
    """A later run on another card, or a row of the shared fp16 weight or occupancy experiments, does
    not replace the reference device's default-launch figure; without a reference row the newest other
    card's row stands."""
    from andromeda_nb.analysis.results_doc import _pick

    df = pd.DataFrame({"ok": True, "variant": "v", "timestamp": ["1", "2", "3", "4", "5"],
                       "device": ["NVIDIA H200", "NVIDIA H200", "NVIDIA H200", "NVIDIA H100 80GB HBM3",
                                  "NVIDIA H100 80GB HBM3"],
                       "notes": ["block=256", "block=256 f16_weights=shared", "block=128 blocks/SM=5",
                                 "block=256", "block=256 tile_order=steps"]})
    assert _pick(df, {"variant": "v"})["timestamp"] == "1"
    assert _pick(df[df["device"] != "NVIDIA H200"], {"variant": "v"})["timestamp"] == "4"


def test_a_root_that_is_not_the_repository_is_refused(tmp_path, capsys):
    from andromeda_nb.analysis import results_doc

    for root in (tmp_path / "missing", tmp_path):
        with pytest.raises(SystemExit) as exc:
            results_doc.main(["--root", str(root), "--check"])
        assert exc.value.code == 2 and "is not the repository's root" in capsys.readouterr().err
