"""Peers of the fused gated kernel, run by the scoring suite's ``peers`` phase on the same table in
the same process: a Triton kernel of the same model and its PyTorch versions (eager and
``torch.compile``). Each writes every ad's score to memory, as ``gated_scores_to_memory`` does.

All compute the model of ``math="fp16"`` (docs/design.md, "Storage and math"): gamma, beta,
G / sqrt(d) and V rounded to fp16 (:func:`~andromeda_nb.score.weights.f16_weights`),
``h = max(gamma * a + beta, 0)`` rounded once to fp16, the gate and value dot products with exact
products and fp32 sums, softmax, top-K of E and the mixture in fp32.

- **Triton**: a program scores ``block`` rows (or, persistent, loops over blocks with the next
  blocks' loads pipelined): it loads them ``[block, d]`` (fp16), encodes h in
  fp32 and rounds it to fp16, and runs the E gate logits and the E value dots as two
  ``tl.dot``\\ s against the ``[d, 16]`` fp16 weight blocks (experts past E zero: ``tl.dot`` needs
  16 columns) on the tensor cores, fp32 accumulation; softmax over the E live columns, the K
  experts by repeated ``argmax`` (ties to the lower expert), one fp32 score stored per row.
- **PyTorch**: the same steps as tensor operations over chunks of rows (a whole 10^8-row pass
  would hold tens of GB of intermediates); h in fp16, the dots as an fp32 matmul of the fp16-valued
  h and weights (exact products), ``torch.topk`` for the K experts. ``torch.compile`` compiles
  the chunk function once (Inductor fuses its elementwise steps around the matmul; h leaves its
  first graph as an fp16 tensor).

GPU only (triton, torch with CUDA); imported inside the functions so the module loads anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: rows of a PyTorch chunk (its fp32 intermediates: ~0.5 GB at d = 64)
TORCH_CHUNK = 1 << 21
#: the Triton peer's tuning grid: (rows a block, warps, pipeline stages, programs an SM: 0 = a
#: program a block, else the persistent kernel)
TRITON_CONFIGS = ((64, 4, 2, 0), (128, 4, 2, 0), (64, 2, 1, 0), (128, 4, 3, 4), (128, 4, 4, 4), (64, 4, 4, 8),
                  (128, 8, 3, 4), (256, 8, 3, 2), (64, 2, 3, 16))


@dataclass(frozen=True)
class PeerWeights:
    """A request's fp16-model weights on the GPU as torch tensors: ``gamma, beta [d]`` float32
    (fp16 values), ``gate, value [d, 16]`` fp16 (``G / sqrt(d)`` and ``V`` transposed, experts
    past E zero), ``E, K``."""

    gamma: object
    beta: object
    gate: object
    value: object
    E: int
    K: int


def peer_weights(request, device: str = "cuda") -> PeerWeights:
    import torch

    from ..model import Request
    from ..score.weights import f16_weights

    if not isinstance(request, Request):
        raise TypeError(f"the peers score the gated model: request must be a Request, got {type(request).__name__}")

    w = f16_weights(request)
    E, d = request.experts, request.d
    if E > 16:
        raise ValueError(f"the peers take E <= 16 (one 16-column dot block), got E={E}")
    gate = np.zeros((d, 16), np.float16)
    value = np.zeros((d, 16), np.float16)
    gate[:, :E] = w["G"].T
    value[:, :E] = w["V"].T

    def dev(x):
        return torch.as_tensor(np.ascontiguousarray(x), device=device)

    return PeerWeights(dev(w["gamma"].astype(np.float32)), dev(w["beta"].astype(np.float32)), dev(gate),
                       dev(value), E, request.k_experts)


def table_tensors(table):
    """``(rows [n, d] fp16, bias [n] float32)``: a rows-layout fp16 :class:`DeviceAdTable`'s
    memory seen by torch (no copy)."""
    import torch

    if table.layout != "rows" or table.dtype != "fp16":
        raise ValueError(f"the peers read a rows-layout fp16 table, got {table.layout} {table.dtype}")
    return torch.as_tensor(table.embeddings, device="cuda"), torch.as_tensor(table.bias, device="cuda")


# ----------------------------------------------------------------------------- Triton


_TRITON = {}


def _triton_kernel():
    if "kernel" not in _TRITON:
        import triton
        import triton.language as tl

        @triton.jit
        def gated_scores(A, BIAS, GAMMA, BETA, GATE, VALUE, OUT, n, D: tl.constexpr, E: tl.constexpr,
                         K: tl.constexpr, BLOCK: tl.constexpr):
            rows = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
            live = rows < n
            cols = tl.arange(0, D)
            a = tl.load(A + rows[:, None] * D + cols[None, :], mask=live[:, None], other=0.0)
            gamma = tl.load(GAMMA + cols)
            beta = tl.load(BETA + cols)
            h = tl.maximum(a.to(tl.float32) * gamma[None, :] + beta[None, :], 0.0).to(tl.float16)
            j = tl.arange(0, 16)
            logits = tl.dot(h, tl.load(GATE + cols[:, None] * 16 + j[None, :]))  # fp32 accumulation
            values = tl.dot(h, tl.load(VALUE + cols[:, None] * 16 + j[None, :]))
            logits = tl.where(j[None, :] < E, logits, float("-inf"))
            ex = tl.exp(logits - tl.max(logits, axis=1)[:, None])
            total = tl.sum(ex, axis=1)
            mixed = tl.zeros([BLOCK], dtype=tl.float32)
            left = logits
            for _ in tl.static_range(K):
                pick = tl.argmax(left, axis=1, tie_break_left=True)
                chosen = j[None, :] == pick[:, None]
                mixed += tl.sum(tl.where(chosen, ex * values, 0.0), axis=1)
                left = tl.where(chosen, float("-inf"), left)
            bias = tl.load(BIAS + rows, mask=live, other=0.0)
            tl.store(OUT + rows, mixed / total + bias, mask=live)

        @triton.jit
        def gated_scores_persistent(A, BIAS, GAMMA, BETA, GATE, VALUE, OUT, n, D: tl.constexpr, E: tl.constexpr,
                                    K: tl.constexpr, BLOCK: tl.constexpr, STAGES: tl.constexpr):
            # the same body over blocks pid, pid + programs, ...: the loop lets Triton's pipeliner
            # issue the next blocks' loads (STAGES deep) while this one computes
            cols = tl.arange(0, D)
            j = tl.arange(0, 16)
            gamma = tl.load(GAMMA + cols)
            beta = tl.load(BETA + cols)
            gate = tl.load(GATE + cols[:, None] * 16 + j[None, :])
            value = tl.load(VALUE + cols[:, None] * 16 + j[None, :])
            for blk in tl.range(tl.program_id(0), tl.cdiv(n, BLOCK), tl.num_programs(0), num_stages=STAGES):
                rows = blk.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
                live = rows < n
                a = tl.load(A + rows[:, None] * D + cols[None, :], mask=live[:, None], other=0.0)
                h = tl.maximum(a.to(tl.float32) * gamma[None, :] + beta[None, :], 0.0).to(tl.float16)
                logits = tl.where(j[None, :] < E, tl.dot(h, gate), float("-inf"))
                values = tl.dot(h, value)
                ex = tl.exp(logits - tl.max(logits, axis=1)[:, None])
                total = tl.sum(ex, axis=1)
                mixed = tl.zeros([BLOCK], dtype=tl.float32)
                left = logits
                for _ in tl.static_range(K):
                    pick = tl.argmax(left, axis=1, tie_break_left=True)
                    chosen = j[None, :] == pick[:, None]
                    mixed += tl.sum(tl.where(chosen, ex * values, 0.0), axis=1)
                    left = tl.where(chosen, float("-inf"), left)
                bias = tl.load(BIAS + rows, mask=live, other=0.0)
                tl.store(OUT + rows, mixed / total + bias, mask=live)

        _TRITON["kernel"] = gated_scores
        _TRITON["persistent"] = gated_scores_persistent
    return _TRITON


def triton_gated_scores(rows, bias, w: PeerWeights, out, block: int = 128, warps: int = 4, stages: int = 2,
                        programs_per_sm: int = 0) -> None:
    """Enqueue the Triton peer: every row's score into ``out`` (float32 torch tensor ``[n]``).
    ``programs_per_sm`` > 0: the persistent kernel, that many programs an SM looping over the
    blocks with ``stages``-deep load pipelining; 0: a program a block."""
    import torch

    _check_peer_args(rows, bias, w, out)
    n, d = rows.shape
    kernels = _triton_kernel()
    blocks = -(-n // block)
    if programs_per_sm:
        sms = torch.cuda.get_device_properties(rows.device).multi_processor_count
        grid = (min(blocks, sms * programs_per_sm),)
        kernels["persistent"][grid](rows, bias, w.gamma, w.beta, w.gate, w.value, out, n, D=d, E=w.E, K=w.K,
                                    BLOCK=block, STAGES=stages, num_warps=warps)
        return
    kernels["kernel"][(blocks,)](rows, bias, w.gamma, w.beta, w.gate, w.value, out, n, D=d, E=w.E, K=w.K,
                                 BLOCK=block, num_warps=warps, num_stages=stages)


# ----------------------------------------------------------------------------- PyTorch


def torch_gated_chunk(a, bias, gamma, beta, gate, value, E: int, K: int):
    """Scores of a chunk of rows ``a [c, d]`` (fp16), the fp16 model in tensor operations."""
    import torch

    from ..training.models import round_to_f16_once

    h16 = round_to_f16_once(torch.relu(a.double() * gamma.double() + beta.double()))
    # under torch.compile, h16 leaves its graph as an fp16 tensor: a compiler keeping it in fp32
    # inside one fused kernel would compute another model (no-op in eager mode)
    torch._dynamo.graph_break()
    h = h16.float()
    logits = (h @ gate[:, :E].float())
    values = (h @ value[:, :E].float())
    p = torch.softmax(logits, dim=1)
    # the K largest logits, ties to the lower expert (a stable sort; torch.topk breaks ties its own way)
    top = torch.sort(logits, dim=1, descending=True, stable=True).indices[:, :K]
    return (p.gather(1, top) * values.gather(1, top)).sum(dim=1) + bias


_COMPILED = {}


def torch_gated_scores(rows, bias, w: PeerWeights, out, compiled: bool = False, chunk: int = TORCH_CHUNK) -> None:
    """Enqueue the PyTorch peer (eager, or the chunk function under ``torch.compile``) over
    ``chunk``-row chunks, every score into ``out``."""
    import torch

    n = rows.shape[0]
    if isinstance(chunk, bool) or not isinstance(chunk, (int, np.integer)) or chunk < 1:
        raise ValueError(f"chunk must be a positive int (rows a chunk), got {chunk!r}")
    _check_peer_args(rows, bias, w, out)
    fn = torch_gated_chunk
    if compiled:
        if "fn" not in _COMPILED:
            # Inductor keeps a fused kernel's intermediates in fp32 unless told to round them where
            # the code casts (h to fp16): without it, it computes another model (checked: off by
            # ~1e-3 of the score scale, and some ads get other experts); the chunk function's graph
            # break keeps h an fp16 tensor where this option alone did not (torch 2.11, CUDA)
            _COMPILED["fn"] = torch.compile(torch_gated_chunk, dynamic=False,
                                            options={"emulate_precision_casts": True})
        fn = _COMPILED["fn"]
    for lo in range(0, n, chunk):
        hi = min(n, lo + chunk)
        if compiled and hi - lo != chunk:  # one compiled shape: the tail runs eager
            out[lo:hi] = torch_gated_chunk(rows[lo:hi], bias[lo:hi], w.gamma, w.beta, w.gate, w.value, w.E, w.K)
        else:
            out[lo:hi] = fn(rows[lo:hi], bias[lo:hi], w.gamma, w.beta, w.gate, w.value, w.E, w.K)


def _check_peer_args(rows, bias, w: PeerWeights, out) -> None:
    """Raise ValueError unless ``rows [n, d]`` fp16, ``bias [n]`` and ``out [n]`` float32 fit
    ``w`` (a request of width d)."""
    import torch

    if rows.ndim != 2 or rows.dtype != torch.float16:
        raise ValueError(f"rows must be [n, d] float16, got {tuple(rows.shape)} {rows.dtype}")
    n, d = rows.shape
    if w.gamma.shape[0] != d:
        raise ValueError(f"the request has d={w.gamma.shape[0]}, the rows d={d}")
    for name, x in (("bias", bias), ("out", out)):
        if tuple(x.shape) != (n,) or x.dtype != torch.float32:
            raise ValueError(f"{name} must be [{n}] float32, got {tuple(x.shape)} {x.dtype}")
