"""The PyTorch peer of the scoring suite computes the fp16 model (on the CPU here; the Triton peer
and the GPU runs are checked by the suite's rows against the same oracle)."""

import numpy as np
import pytest

import andromeda_nb as anb
from andromeda_nb import checks

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("d, E, K, compiled", [(16, 1, 1, False), (64, 6, 2, False), (32, 8, 4, False),
                                               pytest.param(64, 6, 2, True, marks=pytest.mark.slow)])
def test_torch_peer_scores_the_fp16_model(rng, d, E, K, compiled):
    from andromeda_nb.bench.peers import peer_weights, torch_gated_scores

    n = 1000
    table = anb.AdTable.from_float(rng.standard_normal((n, d)), rng.standard_normal(n), dtype="fp16")
    req = anb.Request.random(d, E, K, rng)
    w = peer_weights(req, device="cpu")
    rows, bias = torch.as_tensor(table.embeddings), torch.as_tensor(table.bias)
    out = torch.empty(n, dtype=torch.float32)
    torch_gated_scores(rows, bias, w, out, compiled=compiled, chunk=300)  # chunks off the table's size
    result = checks.compare_scores(out.numpy(), req, table, math="fp16")
    assert result.ok, result.message
    # and not the fp32 model's scores exactly (h and the weights really are rounded to fp16)
    assert not np.array_equal(out.numpy(), anb.reference.score(req, table).astype(np.float32))


def test_peers_refuse_other_tables():
    from andromeda_nb.bench.peers import table_tensors

    class Table:
        layout, dtype = "tiles", "fp16"

    with pytest.raises(ValueError, match="rows-layout fp16"):
        table_tensors(Table())
