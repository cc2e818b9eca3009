"""Training loop, sampled negatives and export to :class:`~andromeda_nb.Request` /
:class:`~andromeda_nb.AdTable`.

Negatives: a sampled softmax over shared candidates (Yi et al. 2019, "Sampling-bias-corrected neural
modeling for large corpus item recommendations"; Yang et al. 2020, "Mixed negative sampling"). A
batch of B training clicks (drawn uniformly from all clicks, so each click's ad appears with
probability proportional to its popularity) shares C = B + N candidates: the batch's own positives
(in-batch negatives for every other row) plus N ads drawn uniformly from the pool. Each candidate's
logit (its score over ``temperature``) is corrected by ``- log Q(ad)`` with ``Q(ad) = B * pop(ad) + N / n_ads`` (its expected count
among the candidates), so the softmax estimates the full softmax over the pool; a candidate that is
the same ad as the row's positive (an accidental hit) is masked. Loss: cross-entropy of the row's
positive, plus ``lb_coef`` times the Switch load-balancing term for mixtures with K < E and
``route_coef`` times the routing term (:func:`.models.routing_term`) for mixtures. Adam,
linear warm-up and cosine decay; seeded (torch, numpy).
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import asdict, dataclass, replace

import numpy as np
import torch
from tqdm.auto import tqdm

from ..arguments import is_int
from ..model import AdTable, Request
from .data import HIST_LEN, InteractionData
from .models import RankingNet, RetrievalNet, gated_scores, round_to_f16_once, routing_term

#: The compared models: name -> (experts, k_experts); the ranking model has none.
MODELS = {
    "single_tower": (1, 1),
    "mixture_k1": (6, 1),
    "mixture_k2": (6, 2),
    "mixture_k4": (6, 4),
    "dense_mixture": (6, 6),
    "ranking": (None, None),
}


@dataclass(frozen=True)
class TrainConfig:
    """Training hyper-parameters (the same for every model of a comparison)."""

    d: int = 64
    width: int = 64
    hidden: int = 128
    steps: int = 2000
    batch: int = 512
    negatives: int = 512
    lr: float = 3e-3
    warmup: int = 100
    weight_decay: float = 0.0
    lb_coef: float = 0.01
    grad_clip: float = 5.0
    #: 1: the ad side adds a projection of the ad's categories to its id embedding and bias
    #: (:class:`~.models.AdFeatures`); 0: id embeddings alone. Off until measured at preset full on
    #: both datasets: on the synthetic world at 10,000 users and ads (3 seeds, CPU) it raised the
    #: single tower's recall@100 from 0.221 to 0.250 and the K = 2 mixture's from 0.223 to 0.268,
    #: and lowered the ranking model's (0.273 -> 0.257, one seed); at preset full there (H200, 5
    #: seeds, with weight_decay 1e-4, untuned) single tower / K = 2 / ranking reach 0.197 / 0.2065 /
    #: 0.2065, against 0.107 / 0.126 / 0.194 without either; MovieLens-100K is not measured
    ad_features: int = 0
    #: 1: each mixture expert reads its own attention-pooled view of the history (multi-interest
    #: pooling, :class:`~.models.RetrievalNet`) instead of one signal group; 0: signal groups. On the
    #: synthetic world at the demo size it did not lift the K = 2 mixture (validation recall@100
    #: 0.409 against 0.413, the single tower 0.426; data/results/quality_diagnostics.md); preset
    #: full is not measured
    interest_experts: int = 0
    #: 1: every mixture expert reads all signal groups (concatenated, as the single tower does), so
    #: experts differ by their weights, not by what they see; 0: expert e reads group e only.
    #: Exclusive with interest_experts. At the demo size (CPU, 5 seeds, 3,000 validation users) it
    #: lifted the K = 2 mixture by 2.4 +- 0.4 points to the single tower's level (+0.3 +- 0.3;
    #: data/results/quality_diagnostics.md, where the gate's collapse is too). Off: at preset full on
    #: the synthetic world (H100, 5 seeds) it lowered K = 2 by 1.02 +- 0.34 points (0.1963 against
    #: group experts' 0.2065; quality.csv, experiment variant_shared_inputs)
    shared_inputs: int = 0
    #: the sampled softmax's temperature: logits are score / temperature (before the sampling
    #: correction); the ranking a trained model serves does not depend on it
    temperature: float = 1.0
    #: mixtures: the weight of a routing term beside the retrieval loss, minus the mutual information
    #: between a request's candidate ads and the gate's expert, over log E: for each request, the
    #: gate softmax's mean entropy over the batch's candidates less the entropy of its mean. It asks
    #: each ad for a confident choice and a request's ads for different choices, which neither the
    #: retrieval loss nor the load-balancing term does (at the demo size the gate collapsed onto one
    #: expert at lb_coef 0.01 and went flat at 0.1 and 1: data/results/quality_diagnostics.md).
    #: 0: off (at preset full on the synthetic world, 1 made K = 2's gate route but moved recall@100
    #: by -0.27 +- 0.33 points, H100, 5 seeds: experiment variant_routing). Ignored by models without experts
    route_coef: float = 0.0
    #: 1: a training click's request carries the history before its session began (and the
    #: session's context), as the evaluation's request, which opens a new session, does; 0: the
    #: history up to the click itself, where a session's earlier clicks (two thirds or more from
    #: one interest in the synthetic world) give its later ones away. Needs data with sessions (the synthetic world).
    #: Off: at the demo size it left held-out recall@100 where it was (single tower and K = 2, 2
    #: seeds, within 0.25 point; data/results/quality_diagnostics.md)
    session_history: int = 0

    def __post_init__(self):
        """Refuse, by name, a value that would train something else than asked; numpy scalars are
        kept as Python numbers (configurations are written to JSON)."""
        def number(name, integral):
            v = getattr(self, name)
            if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer) if integral else (
                    int, float, np.integer, np.floating)):
                raise ValueError(f"TrainConfig.{name} must be {'an int' if integral else 'a number'}, got {v!r}")
            try:
                v = int(v) if integral else float(v)
            except OverflowError:
                raise ValueError(f"TrainConfig.{name} is out of range: {v!r}") from None
            object.__setattr__(self, name, v)
            return v

        for name in ("d", "width", "hidden", "steps", "batch", "negatives"):
            if number(name, True) < 1:
                raise ValueError(f"TrainConfig.{name} must be a positive int, got {getattr(self, name)!r}")
        if number("warmup", True) < 0:
            raise ValueError(f"TrainConfig.warmup must be an int >= 0, got {self.warmup!r}")
        for name in ("lr", "weight_decay", "lb_coef", "grad_clip", "temperature", "route_coef"):
            v = number(name, False)
            if not (0 <= v < math.inf) or (name in ("lr", "temperature") and v == 0):
                raise ValueError(f"TrainConfig.{name} must be a finite number "
                                 f"{'> 0' if name in ('lr', 'temperature') else '>= 0'}, got {v!r}")
        for name in ("ad_features", "interest_experts", "shared_inputs", "session_history"):  # switches: 2 must not pass for "on"
            v = getattr(self, name)
            if not isinstance(v, (int, np.integer)) or v not in (0, 1):
                raise ValueError(f"TrainConfig.{name} is a switch, 0 or 1; got {v!r}")
            object.__setattr__(self, name, int(v))
        if self.interest_experts and self.shared_inputs:
            raise ValueError("TrainConfig.interest_experts and shared_inputs each say what an expert reads: "
                             "set one of them")


def make_net(name: str, data: InteractionData, cfg: TrainConfig):
    args = (data.n_users, data.n_ads, data.demo_cards, data.ad_cats.shape[1], data.ctx_cards)
    if name == "ranking":
        return RankingNet(*args, d=cfg.d, width=cfg.width, hidden=cfg.hidden, ad_features=bool(cfg.ad_features))
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose from {list(MODELS)}")
    E, K = MODELS[name]
    return RetrievalNet(*args, d=cfg.d, experts=E, k_experts=K, width=cfg.width, hidden=cfg.hidden,
                        ad_features=bool(cfg.ad_features), interest_experts=bool(cfg.interest_experts),
                        shared_inputs=bool(cfg.shared_inputs))


def _to_torch(batch: dict, device) -> dict:
    return {k: _on(v, device) for k, v in batch.items()}


def _on(a: np.ndarray, device) -> torch.Tensor:
    """``a`` on ``device``; to a GPU through pinned memory without waiting, so the host prepares the
    next step's batch while the GPU runs this one (a copy from pageable memory would wait for it)."""
    device = torch.device(device)
    if device.type != "cuda":
        return torch.as_tensor(a, device=device)
    return torch.tensor(np.asarray(a)).pin_memory().to(device, non_blocking=True)


def _ad_cats(data: InteractionData, device) -> torch.Tensor:
    cats = np.concatenate([data.ad_cats, np.zeros((1, data.ad_cats.shape[1]), np.float32)])
    return torch.as_tensor(cats, device=device)


class TrainedModel:
    """A trained model with its data: evaluation forward passes and export.

    Attributes:
        name, net, data, cfg, seed, device; ``history``: per-step loss (a list of floats);
        ``seconds``: training wall time; ``validation``: ``{steps: value}`` at the checkpoints of
        :func:`train_model`.
    """

    def __init__(self, name, net, data, cfg, seed, device, history=None, seconds=0.0):
        self.name, self.net, self.data, self.cfg, self.seed = name, net, data, cfg, seed
        self.device = torch.device(device)
        self.history = [] if history is None else history
        self.validation = {}  # steps -> validation value at that checkpoint (train_model's checkpoints)
        self.seconds = seconds
        self._cats = _ad_cats(data, self.device)

    @property
    def is_retrieval(self) -> bool:
        return isinstance(self.net, RetrievalNet)

    @property
    def experts(self):
        return self.net.experts if self.is_retrieval else None

    @property
    def k_experts(self):
        return self.net.k_experts if self.is_retrieval else None

    # ---- export -----------------------------------------------------------------------------
    @torch.no_grad()
    def request_tensors(self, rows) -> tuple[np.ndarray, ...]:
        """``(V [n, E, d], G, gamma [n, d], beta)`` float32 of the evaluation requests of ``rows``."""
        if not self.is_retrieval:
            raise TypeError("the ranking model is not a retrieval model: it has no Request to export")
        self.net.eval()
        b = _to_torch(self.data.batch(np.asarray(rows)), self.device)
        return tuple(x.float().cpu().numpy() for x in self.net.request(b, self._cats))

    def export_request(self, user_id, k_experts: int | None = None) -> Request:
        """The user's evaluation request as docs/design.md's tensors (``k_experts`` default: the
        trained K)."""
        V, G, gamma, beta = (x[0] for x in self.request_tensors([self.data.row_of(user_id)]))
        return Request(V=V, G=G, gamma=gamma, beta=beta, k_experts=k_experts or self.k_experts)

    @torch.no_grad()
    def ad_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """``(a [n_ads, d], b [n_ads])`` float32 (the id embeddings plus the category projection)."""
        a, b = self.net.ad_rows(torch.arange(self.data.n_ads, device=self.device), self._cats)
        return a.float().cpu().numpy().copy(), b.float().cpu().numpy().copy()

    def export_table(self, dtype: str = "fp32") -> AdTable:
        """The ad table (``ad_ids`` = the data's ids, slot order) in a storage dtype."""
        if not self.is_retrieval:
            raise TypeError("the ranking model is not a retrieval model: it has no AdTable to export")
        a, b = self.ad_arrays()
        return AdTable.from_float(a, b, dtype=dtype, ad_ids=self.data.ad_ids)

    # ---- the model's own forward pass ---------------------------------------------------------
    @torch.no_grad()
    def forward_scores(self, rows, chunk_ads: int = 1 << 30, users_per_chunk: int = 8) -> np.ndarray:
        """``[len(rows), n_ads]`` float32 scores of every ad for the evaluation requests of ``rows``
        (the torch model's own forward pass, hard top-K)."""
        self.net.eval()
        rows = np.asarray(rows, dtype=np.int64)
        A = self.data.n_ads
        out = np.empty((rows.size, A), np.float32)
        per_pair = self.cfg.d * (HIST_LEN + 8) if not self.is_retrieval else self.cfg.d
        budget = 1e9 if self.device.type == "cuda" else 4e7  # floats per intermediate
        cap = max(256, int(budget // max(1, users_per_chunk * per_pair)))
        for s in range(0, rows.size, users_per_chunk):
            r = rows[s: s + users_per_chunk]
            b = _to_torch(self.data.batch(r), self.device)
            state = self.net.user_state(b, self._cats) if not self.is_retrieval else self.net.request(b, self._cats)
            for c0 in range(0, A, min(cap, chunk_ads)):
                cand = torch.arange(c0, min(A, c0 + cap), device=self.device)
                if self.is_retrieval:
                    V, G, gamma, beta = state
                    sc = gated_scores(V, G, gamma, beta, *self.net.ad_rows(cand, self._cats), self.net.k_experts)
                else:
                    sc = self.net.score_state(state, cand, self._cats)
                out[s: s + r.size, c0: c0 + cand.numel()] = sc.float().cpu().numpy()
        return out


def score_exported(V, G, gamma, beta, table: AdTable, k_experts: int, users_per_chunk: int = 8,
                   device="cpu", math: str = "fp32") -> np.ndarray:
    """docs/design.md's score of exported tensors ``V [n, E, d]`` ... over a stored table, in float32
    torch on the table the kernel reads (dequantized): ``[n, n_ads]``. Equal to the oracle up to
    fp32 rounding (the oracle is float64); used for full-scale evaluation on a CPU.

    ``math="fp16"``: the model the fp16 math mode computes (``reference.score(math="fp16")``):
    gamma, beta, G / sqrt(d) and V rounded to fp16, h rounded to fp16 after the FiLM and ReLU,
    products of fp16 values (exact in fp32) summed in fp32."""
    if math not in ("fp32", "fp16"):
        raise ValueError(f"math must be 'fp32' or 'fp16', got {math!r}")
    if math == "fp16":
        return _score_exported_fp16(V, G, gamma, beta, table, k_experts, users_per_chunk, device)
    A = torch.as_tensor(np.asarray(table.dequantized(), np.float32), device=device)
    b = torch.as_tensor(table.bias, device=device)
    n = V.shape[0]
    out = np.empty((n, table.n_ads), np.float32)
    with torch.no_grad():
        for s in range(0, n, users_per_chunk):
            t = [torch.as_tensor(x[s: s + users_per_chunk], device=device) for x in (V, G, gamma, beta)]
            out[s: s + t[0].shape[0]] = gated_scores(*t, A, b, k_experts).cpu().numpy()
    return out


def _score_exported_fp16(V, G, gamma, beta, table: AdTable, k_experts: int, users_per_chunk: int, device
                         ) -> np.ndarray:
    from ..reference import math_rows
    from ..score.weights import f16_weights

    A = torch.as_tensor(np.asarray(math_rows(table, "fp16"), np.float32), device=device)  # int8: dequantized to fp16
    b = torch.as_tensor(table.bias, device=device)
    n, E, d = V.shape
    out = np.empty((n, table.n_ads), np.float32)

    def half(x):  # fp16-rounded, held in fp32
        return torch.as_tensor(np.asarray(x, np.float16).astype(np.float32), device=device)

    with torch.no_grad():
        for s in range(n):
            w = f16_weights(Request(V=V[s], G=G[s], gamma=gamma[s], beta=beta[s], k_experts=k_experts))
            # gamma * a + beta in float64, rounded once to fp16 as the model rounds h: fp32 then
            # fp16 would round twice and put an h one fp16 ulp off now and then
            h64 = torch.relu(half(w["gamma"]).double() * A.double() + half(w["beta"]).double())
            h = round_to_f16_once(h64).float()  # [n_ads, d]
            logits, values = h @ half(w["G"]).T, h @ half(w["V"]).T  # G already holds 1 / sqrt(d)
            p = torch.softmax(logits, dim=-1)
            mask = torch.zeros_like(logits).scatter_(-1, torch.topk(logits, k_experts, dim=-1).indices, 1.0)
            out[s] = ((mask * p * values).sum(-1) + b).cpu().numpy()
    return out


def pick_device(device: str = "auto") -> torch.device:
    """The torch device of ``device`` (a torch.device, or its name): ``"auto"`` (CUDA where torch has
    it, else the CPU), ``"cpu"``, ``"cuda"`` or ``"cuda:N"``; ValueError for another name or a CUDA device this torch lacks."""
    if isinstance(device, torch.device):
        device = str(device)
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not isinstance(device, str) or not re.fullmatch(r"cpu|cuda(:\d+)?", device):
        raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}")
    if device.startswith("cuda"):
        index = int(device.partition(":")[2] or 0)
        if not torch.cuda.is_available() or index >= torch.cuda.device_count():
            raise ValueError(f"device {device!r}: this torch ({torch.__version__}) sees "
                             f"{torch.cuda.device_count() if torch.cuda.is_available() else 'no'} CUDA device(s)")
    return torch.device(device)


def train_model(name: str, data: InteractionData, cfg: TrainConfig = TrainConfig(), seed: int = 0,
                device: str = "auto", progress: bool = True, checkpoints=(), validate=None,
                on_step=None) -> TrainedModel:
    """Train one model (see the module docstring for the loss and sampling).

    Args:
        name: a key of :data:`MODELS`.
        data: :class:`~andromeda_nb.training.data.InteractionData`.
        cfg: hyper-parameters; seed: seeds torch and numpy; device: ``"auto"``, ``"cpu"``, ``"cuda"``.
        checkpoints: step counts at which ``validate(model)`` (the model so far, in eval mode) is
            called; its values go to ``model.validation`` ``{steps: value}`` (early stopping:
            :func:`~andromeda_nb.training.tuning.tune`).
        on_step: called with the step's index after each optimizer step (the step's kernels may
            still run; :func:`~andromeda_nb.training.profiling.profile_steps` times them).

    Returns:
        :class:`TrainedModel`.
    """
    if not is_int(seed) or not 0 <= seed < 2**63:
        raise ValueError(f"seed must be an int in 0..2**63 - 1 (torch's seeds), got {seed!r}")
    checkpoints = list(checkpoints)
    if any(isinstance(c, (bool, np.bool_)) or not isinstance(c, (int, np.integer)) for c in checkpoints):
        raise ValueError(f"checkpoints must be step counts (ints), got {checkpoints!r}")
    checks = sorted({int(c) for c in checkpoints})
    if checks and (not callable(validate) or checks[0] < 1 or checks[-1] > cfg.steps):
        raise ValueError(f"checkpoints must lie in 1..{cfg.steps} (the steps trained) and come with a callable "
                         f"validate, got {checks} and {validate!r}")
    if cfg.session_history and data.seq_start is None:
        raise ValueError(f"TrainConfig.session_history=1 needs sessions, which {data.name} does not have")
    dev = pick_device(device)
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    net = make_net(name, data, cfg).to(dev)
    cats = _ad_cats(data, dev)
    rows_all, t_all = data.events()
    n_ev = rows_all.size
    B = min(cfg.batch, n_ev)
    N = cfg.negatives
    pop = torch.as_tensor(data.popularity / data.popularity.sum(), dtype=torch.float32, device=dev)
    opt = torch.optim.Adam(net.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)

    def lr_at(step):
        if step < cfg.warmup:
            return (step + 1) / cfg.warmup
        frac = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    history = []
    pending = []  # the losses still on the device: read back every 50 steps, not every step (a read waits
    # for the GPU, and the host then has no batch ready for the next step)

    def flush():
        if pending:
            history.extend(torch.stack(pending).tolist())
            pending.clear()

    model = TrainedModel(name, net, data, cfg, seed, dev, history)
    perm = rng.permutation(n_ev)
    cursor = 0
    t0 = time.perf_counter()
    net.train()
    bar = tqdm(range(cfg.steps), desc=f"{data.name}/{name}/seed{seed}", disable=not progress, leave=False)
    for step in bar:
        if cursor + B > n_ev:
            perm, cursor = rng.permutation(n_ev), 0
        idx = perm[cursor: cursor + B]
        cursor += B
        batch = _to_torch(data.batch(rows_all[idx], t_all[idx], session=bool(cfg.session_history)), dev)
        pos = _on(data.seq[rows_all[idx], t_all[idx]], dev)
        neg = _on(rng.integers(0, data.n_ads, N), dev)
        cand = torch.cat([pos, neg])
        logq = torch.log(B * pop[cand] + N / data.n_ads)
        if isinstance(net, RetrievalNet) and net.experts > 1:
            s, p, mask = net.score(batch, cand, cats, return_gate=True)
        else:
            s, p, mask = net.score(batch, cand, cats), None, None
        logits = (s if cfg.temperature == 1.0 else s / cfg.temperature) - logq[None, :]
        hit = (cand[None, :] == pos[:, None])
        diag = torch.arange(B, device=dev)
        hit[diag, diag] = False
        logits = logits.masked_fill(hit, -1e9)
        loss = torch.nn.functional.cross_entropy(logits, diag)
        if p is not None and net.k_experts < net.experts and cfg.lb_coef > 0:
            f = mask.mean(dim=(0, 1)) / net.k_experts
            P = p.mean(dim=(0, 1))
            loss = loss + cfg.lb_coef * net.experts * (f * P).sum()
        if p is not None and cfg.route_coef > 0:
            loss = loss + cfg.route_coef * routing_term(p)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.grad_clip:
            torch.nn.utils.clip_grad_norm_(net.parameters(), cfg.grad_clip)
        opt.step()
        sched.step()
        pending.append(loss.detach())
        if on_step is not None:
            on_step(step)
        if step % 50 == 0:
            flush()
            bar.set_postfix(loss=f"{np.mean(history[-50:]):.3f}")
        if checks and step + 1 == checks[0]:
            flush()
            checks.pop(0)
            t_val = time.perf_counter()
            net.eval()
            value = validate(model)
            if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)) or (
                    not np.isfinite(value)):
                raise ValueError(f"validate returned {value!r} at step {step + 1}: a finite number is needed")
            model.validation[step + 1] = float(value)
            net.train()
            t0 += time.perf_counter() - t_val  # seconds: training time, validation left out
    flush()  # waits for the last step: the seconds below are the training's
    net.eval()
    model.seconds = time.perf_counter() - t0
    return model


def config_dict(cfg: TrainConfig) -> dict:
    return asdict(cfg)


def with_overrides(cfg: TrainConfig, **kw) -> TrainConfig:
    return replace(cfg, **{k: v for k, v in kw.items() if v is not None})
