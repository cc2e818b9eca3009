"""The request-step diagnostics run end to end on small sizes (simulator) and check their own rows."""

from andromeda_nb.bench import request_steps


def test_request_step_rows_verify_themselves(tmp_path):
    rows = request_steps.gather_rows(3000, 0.05, batches=(1, 3), reps=1)
    rows += request_steps.final_rows(500, 40, 10, batches=(1, 4), reps=1)
    assert [(r["step"], r["batch"]) for r in rows] == [("gather", 1), ("gather", 3), ("final_rank", 1),
                                                       ("final_radix", 1), ("final_rank", 4), ("final_radix", 4)]
    assert all(r["verified"] == "yes" for r in rows)
