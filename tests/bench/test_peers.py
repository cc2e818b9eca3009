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


def test_h_is_rounded_to_fp16_once(rng):
    """Values a hair off fp16 rounding midpoints (where float64 -> fp32 -> fp16 rounds twice and
    goes the wrong way), both signs, zeros, subnormals, NaN and inf: the peer's rounding equals
    numpy's single float64 -> fp16 rounding."""
    from andromeda_nb.training.models import round_to_f16_once

    lo = rng.standard_normal(4000).astype(np.float16)
    lo[:100] = rng.integers(1, 100, 100).astype(np.float16) * np.float16(2.0 ** -24)  # subnormals
    mid = (lo.astype(np.float64) + np.nextafter(lo, np.float16(np.inf)).astype(np.float64)) / 2
    nudge = np.abs(mid) * 2.0 ** -30 * rng.choice([-1.0, 1.0, 0.0], mid.size)
    x = np.concatenate([mid + nudge, rng.standard_normal(1000) * 100, [0.0, -0.0, np.nan, np.inf, -np.inf]])
    want = x.astype(np.float16)
    got = round_to_f16_once(torch.as_tensor(x)).numpy()
    np.testing.assert_array_equal(got, want)
    assert np.array_equal(np.signbit(got), np.signbit(want))


def test_torch_peer_breaks_expert_ties_to_the_lower_expert(rng):
    """Equal gate keys tie every expert: the model (and the kernel) take the lower experts."""
    from andromeda_nb.bench.peers import peer_weights, torch_gated_scores

    n, d, E, K = 257, 16, 4, 1
    table = anb.AdTable.from_float(rng.standard_normal((n, d)), rng.standard_normal(n), dtype="fp16")
    r = anb.Request.random(d, E, K, rng)
    req = anb.Request(V=r.V, G=np.repeat(r.G[:1], E, axis=0), gamma=r.gamma, beta=r.beta, k_experts=K)
    out = torch.empty(n, dtype=torch.float32)
    torch_gated_scores(torch.as_tensor(table.embeddings), torch.as_tensor(table.bias), peer_weights(req, "cpu"), out)
    # compare_scores forgives the other expert at near-ties, and here every logit ties: the oracle's
    # own choice (the lower expert) is the one to match, to fp32 summation order
    want = anb.reference.score(req, table, math="fp16")
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_peer_arguments_are_checked(rng):
    from andromeda_nb.bench.peers import peer_weights, torch_gated_scores

    table = anb.AdTable.from_float(rng.standard_normal((10, 16)), dtype="fp16")
    rows, bias = torch.as_tensor(table.embeddings), torch.as_tensor(table.bias)
    w = peer_weights(anb.Request.random(16, 2, 1, rng), "cpu")
    out = torch.empty(10, dtype=torch.float32)
    for chunk in (0, -5, 2.0, True):
        with pytest.raises(ValueError, match="chunk"):
            torch_gated_scores(rows, bias, w, out, chunk=chunk)
    with pytest.raises(ValueError, match="d=32"):
        torch_gated_scores(rows, bias, peer_weights(anb.Request.random(32, 2, 1, rng), "cpu"), out)
    with pytest.raises(ValueError, match="out"):
        torch_gated_scores(rows, bias, w, torch.empty(11, dtype=torch.float32))
    with pytest.raises(TypeError, match="Request"):
        peer_weights(rng.standard_normal(16), "cpu")


def test_peers_refuse_other_tables():
    from andromeda_nb.bench.peers import table_tensors

    class Table:
        layout, dtype = "tiles", "fp16"

    with pytest.raises(ValueError, match="rows-layout fp16"):
        table_tensors(Table())
