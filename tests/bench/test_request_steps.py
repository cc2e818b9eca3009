"""The request-step diagnostics run end to end on small sizes (simulator) and check their own rows."""

from andromeda_nb.bench import request_steps


def test_request_step_rows_verify_themselves(tmp_path):
    rows = request_steps.gather_rows(3000, 0.05, batches=(1, 3), reps=1)
    rows += request_steps.final_rows(500, 40, 10, batches=(1, 4), reps=1)
    assert [(r["step"], r["batch"]) for r in rows] == [("gather", 1), ("gather", 3), ("final_rank", 1),
                                                       ("final_radix", 1), ("final_rank", 4), ("final_radix", 4)]
    assert all(r["verified"] == "yes" for r in rows)


def test_bad_arguments_are_refused_before_any_work(tmp_path, capsys):
    import pytest

    for args in (["--steps", "bogus"], ["--batches", "0"], ["--batches", "x"], ["--reps", "0"], ["--k", "0"],
                 ["--k", "5000"], ["--kept", "4000", "--n", "3000"], []):  # [] : the simulator has no device time
        with pytest.raises(SystemExit) as e:
            request_steps.main(["--out", str(tmp_path / "o"), *args])
        assert e.value.code == 2, args
    assert not (tmp_path / "o").exists()
    assert "simulator" in capsys.readouterr().err
