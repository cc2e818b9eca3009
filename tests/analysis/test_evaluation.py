"""The quickstart's helpers (andromeda_nb.analysis.evaluation) on hand-made tables."""

import types

import numpy as np
import pandas as pd
import pytest

from andromeda_nb.analysis import evaluation


def test_sample_users_is_seeded_sorted_and_bounded():
    world = types.SimpleNamespace(users=np.arange(100, 130))
    a, b = evaluation.sample_users(world, 5, seed=3), evaluation.sample_users(world, 5, seed=3)
    assert np.array_equal(a, b) and np.all(np.diff(a) > 0) and set(a) <= set(world.users)
    assert evaluation.sample_users(world, None).size == 30 and evaluation.sample_users(world, 99).size == 30
    with pytest.raises(ValueError, match="n_users"):
        evaluation.sample_users(world, 0)


def test_checks_metrics_and_findings():
    runs = pd.DataFrame({"user": [1, 2], "exact": [True, True], "near_f64": [True, True], "eligible_ok": [True, False],
                         "n_eligible": [10, 20], "recall@10": [0.1, 0.3]})
    assert evaluation.answer_checks(runs).to_dict() == {"exact": True, "near_f64": True, "eligible_ok": False}
    table = pd.DataFrame({"device": [0.2], "oracle_same_users": [0.2], "oracle_all_users": [0.25]}, index=["recall@10"])
    assert evaluation.recall_metrics(table) == {"recall@10_device": 0.2, "recall@10_oracle_same_users": 0.2,
                                                "recall@10_oracle_all_users": 0.25}
    text = evaluation.quickstart_findings(runs, table, pd.Series([0.5, 1.0]))
    assert "**checks failed**: eligible_ok" in text
    assert "recall@10: 0.200 on the device against 0.200 for the float64 oracle" in text and "0.250 on every user" in text
    assert "on average 75% of a user's held-out movies" in text
    assert "simulator" in evaluation.run_note(4, 2, "fp16", "cudasim")
    assert "simulator" not in evaluation.run_note(4, 2, "fp16", "cuda")
    assert evaluation.run_note(4, 2, "fp16", "cuda").endswith("placeholder SVD model") and "placeholder" in text
    assert evaluation.run_note(6, 2, "fp16", "cuda", "mixture_k2").endswith("trained mixture_k2")
    trained = evaluation.quickstart_findings(runs, table, pd.Series([0.5, 1.0]), "mixture_k2", "preset demo, 400 steps")
    assert "trained `mixture_k2` (preset demo, 400 steps)" in trained and "placeholder" not in trained
    assert "2 requests ran" in trained and "1 request ran" in evaluation.quickstart_findings(runs[:1], table,
                                                                                          pd.Series([0.5]))
    assert "train no useful model" in evaluation.quickstart_findings(runs, table, pd.Series([0.5]), "mixture_k2",
                                                                     "preset smoke, 6 steps in 0 s")
