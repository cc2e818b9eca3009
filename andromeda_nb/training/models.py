"""PyTorch models: the retrieval models of docs/design.md (single tower, gated mixtures) and a ranking
model with user x ad cross features (the quality anchor).

Retrieval models compute exactly docs/design.md's tensors, so what they export is what the fused kernel
scores::

    per request  V[E, d], G[E, d]   from the user experts (expert e reads signal group e only)
                 gamma[d], beta[d]  from the request context (FiLM), gamma = 1 + f(ctx), beta = g(ctx)
    per ad       a[d], b            an embedding table and a bias

    h = relu(gamma * a + beta); logit = G h / sqrt(d); p = softmax(logit) over all E
    S = top-K experts by logit;  score = sum_{e in S} p[e] * dot(V[e], h) + b

Top-K in training: the forward pass uses the hard top-K mask (exactly the served model). Gradients
flow through ``p[e]`` of the selected experts, i.e. through the softmax over *all* E logits (the
denominator), so unselected experts' keys get gradient too and the gate learns at K = 1
(Switch-Transformer style, Fedus et al. 2021). The selection itself is not differentiated (no
straight-through estimator). An optional Switch load-balancing loss ``E * sum_e f_e * P_e`` (``f_e``:
share of (request, ad) pairs routed to e; ``P_e``: mean gate weight) keeps experts in use; an
optional routing term (:func:`routing_term`) asks each ad for a confident choice and a request's ads
for different ones.

The single tower (E = 1, K = 1) reads every group (concatenated) into one value vector; it still
gets the context FiLM, so it differs from the mixtures only in the expert structure.

``interest_experts`` (mixtures): expert e reads instead its own attention-pooled view of the history,
``sum_l softmax_l(q_e . tanh(W emb_l)) emb_l`` (self-attentive multi-interest pooling, as in
ComiRec-SA), so experts can hold different interests of one user, where every history group above
is a mean over all of them; the per-ad gate then picks the interests an ad matches.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .data import GROUPS, RECENT


def _mlp(inp: int, hidden: int, out: int, zero_last: bool = False) -> nn.Sequential:
    last = nn.Linear(hidden, out)
    if zero_last:
        nn.init.zeros_(last.weight)
        nn.init.zeros_(last.bias)
    return nn.Sequential(nn.Linear(inp, hidden), nn.ReLU(), last)


def history_softmax(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Attention weights over a user's history: a softmax of ``logits [B, ..., L]`` (positions on the
    last axis) over the clicked positions (``mask [B, L]``, 1 for a click), all zero for a user
    with none."""
    shape = (mask.shape[0],) + (1,) * (logits.dim() - 2)
    neg = (1.0 - mask).view(*shape, mask.shape[1]) * -1e4
    return torch.softmax(logits + neg, dim=-1) * (mask.sum(1) > 0).float().view(*shape, 1)


class UserFeatures(nn.Module):
    """Encodes the six signal groups (data.GROUPS) of a batch into ``{group: [B, width]}``."""

    def __init__(self, n_users: int, n_ads: int, demo_cards, n_cats: int, width: int = 64):
        super().__init__()
        self.n_ads = n_ads
        self.demo = nn.ModuleList(nn.Embedding(int(c), width) for c in demo_cards)
        self.user = nn.Embedding(n_users, width)
        self.item = nn.Embedding(n_ads + 1, width, padding_idx=n_ads)
        self.cat = nn.Linear(n_cats, width)
        for emb in [*self.demo, self.user, self.item]:
            nn.init.normal_(emb.weight, std=0.1)
        with torch.no_grad():
            self.item.weight[n_ads].zero_()

    def history(self, hist):
        mask = (hist < self.n_ads).float()
        return self.item(hist), mask

    def forward(self, batch: dict, ad_cats: torch.Tensor) -> dict:
        hist = batch["hist"]
        emb, mask = self.history(hist)
        def mean(e, m):
            return (e * m[..., None]).sum(1) / m.sum(1, keepdim=True).clamp(min=1.0)
        cats = ad_cats[hist]  # ad_cats has a zero row at index n_ads (the pad)
        profile = cats.sum(1) / mask.sum(1, keepdim=True).clamp(min=1.0)
        return {
            "demographics": sum(e(batch["demo"][:, j]) for j, e in enumerate(self.demo)),
            "user_id": self.user(batch["user"]),
            "long_term": mean(emb, mask),
            "recent": mean(emb[:, -RECENT:], mask[:, -RECENT:]),
            "last_item": emb[:, -1],
            "category_profile": self.cat(profile),
            "_profile": profile,
            "_hist_emb": emb,
            "_hist_mask": mask,
        }


class ContextFiLM(nn.Module):
    """Request context codes -> ``gamma = 1 + f(ctx)``, ``beta = g(ctx)`` (starts at 1 and 0)."""

    def __init__(self, ctx_cards, d: int, width: int = 32):
        super().__init__()
        self.emb = nn.ModuleList(nn.Embedding(int(c), width) for c in ctx_cards)
        self.mlp = _mlp(width, 64, 2 * d, zero_last=True)
        self.d = d

    def forward(self, ctx):
        x = sum(e(ctx[:, j]) for j, e in enumerate(self.emb))
        out = self.mlp(x)
        return 1.0 + out[:, : self.d], out[:, self.d:]


class AdFeatures(nn.Module):
    """An ad's categories (``ad_cats`` rows: the synthetic world's topic, MovieLens' genres) -> a
    ``[d]`` addition to its embedding and a scalar addition to its bias.

    Why: an id embedding learns only from the ad's own clicks (about 20 a training run in the
    synthetic world), so most ads' rows stay close to their random start; the categories are shared
    by hundreds of ads and learn from all their clicks. The exported table holds the sum (``a`` =
    id embedding + projection), so served models and the kernels are unchanged."""

    def __init__(self, n_cats: int, d: int):
        super().__init__()
        self.proj = nn.Linear(n_cats, d + 1, bias=False)
        nn.init.normal_(self.proj.weight, std=0.3)
        with torch.no_grad():
            self.proj.weight[d].zero_()
        self.d = d

    def forward(self, cats):
        out = self.proj(cats)
        return out[..., : self.d], out[..., self.d]


def gated_scores(V, G, gamma, beta, A, b, k_experts: int, return_gate: bool = False):
    """docs/design.md's score in torch (float32), with the hard top-K mask.

    Args:
        V, G: ``[B, E, d]``; gamma, beta: ``[B, d]``; A: ``[C, d]`` (shared candidates) or
            ``[B, C, d]``; b: ``[C]`` or ``[B, C]``; k_experts: K.

    Returns:
        scores ``[B, C]`` (and, with ``return_gate``, ``(p, mask)`` each ``[B, C, E]``).
    """
    B, E, d = V.shape
    Ab = A.unsqueeze(0) if A.dim() == 2 else A
    h = torch.relu(gamma[:, None, :] * Ab + beta[:, None, :])  # [B, C, d]
    if E == 1 and not return_gate:  # p = 1: score = dot(V, h) + b (a [B,C,d]x[B,d,2] bmm is slow on CPUs)
        return (h * V).sum(-1) + (b if b.dim() == 2 else b[None, :])
    both = torch.bmm(h, torch.cat([G, V], dim=1).transpose(1, 2))  # [B, C, 2E]
    logits = both[..., :E] / math.sqrt(d)
    values = both[..., E:]
    p = torch.softmax(logits, dim=-1)
    if k_experts < E:
        idx = torch.topk(logits, k_experts, dim=-1).indices
        mask = torch.zeros_like(logits).scatter_(-1, idx, 1.0)
    else:
        mask = torch.ones_like(logits)
    scores = (mask * p * values).sum(-1) + (b if b.dim() == 2 else b[None, :])
    if return_gate:
        return scores, p, mask
    return scores


def routing_term(p: torch.Tensor) -> torch.Tensor:
    """Minus the mutual information between a request's candidate ads and the gate's expert, over
    log E (``TrainConfig.route_coef``): for gate softmaxes ``p [B, C, E]`` (request, candidate,
    expert), the mean over requests of ``mean_c H(p[b, c]) - H(mean_c p[b, c])``. In [-1, 0]: 0 when
    every ad of a request gets the same distribution (a collapsed or a flat gate), -1 when each ad
    puts all its weight on one expert and a request's ads use every expert equally."""
    def entropy(q):
        return -(q * torch.log(q.clamp_min(1e-12))).sum(-1)

    return (entropy(p).mean(-1) - entropy(p.mean(1))).mean() / math.log(p.shape[-1])


def round_to_f16_once(x64):
    """``x64`` (float64) rounded once to fp16, as the fp16 math mode's model rounds h
    (``reference.score(math="fp16")``).

    ``gamma * a + beta`` is exact in float64 (a product of two fp16 values has 22 bits), but
    torch converts float64 to fp16 through fp32, and about one element in 2^14 lands on an fp16
    rounding midpoint in fp32 and then rounds the wrong way (seen: an h one fp16 ulp off the
    model's, a score off by 3x the fp32 tolerance). Rounding to fp32 *to odd* (toward zero, then
    an inexact result gets its last bit set) keeps it off those midpoints, so the second rounding
    is the correct one.
    """
    x32 = x64.float()
    back = x32.double()
    bits = x32.view(torch.int32) - (back.abs() > x64.abs()).to(torch.int32)  # toward zero
    bits = bits | (back != x64).to(torch.int32)  # an inexact result is odd
    return bits.view(torch.float32).half()


class RetrievalNet(nn.Module):
    """Single tower (``experts=1``) or a gated mixture of ``experts`` user experts with top-K.

    Expert e reads signal group ``GROUPS[e]`` through a 2-layer MLP and emits ``(V[e], G[e])``;
    with ``shared_inputs`` every expert reads all groups (concatenated, the single tower's input).
    """

    def __init__(self, n_users, n_ads, demo_cards, n_cats, ctx_cards, d: int = 64, experts: int = 6,
                 k_experts: int = 2, width: int = 64, hidden: int = 128, ad_features: bool = False,
                 interest_experts: bool = False, shared_inputs: bool = False):
        super().__init__()
        if not 1 <= k_experts <= experts <= len(GROUPS):
            raise ValueError(f"need 1 <= k_experts <= experts <= {len(GROUPS)}, got K={k_experts}, E={experts}")
        if interest_experts and shared_inputs:
            raise ValueError("interest_experts and shared_inputs each say what an expert reads: set one of them")
        self.d, self.experts, self.k_experts = d, experts, k_experts
        self.features = UserFeatures(n_users, n_ads, demo_cards, n_cats, width)
        self.film = ContextFiLM(ctx_cards, d)
        self.shared_inputs = shared_inputs and experts > 1
        if experts == 1:
            self.tower = _mlp(width * len(GROUPS), 2 * hidden, d)
        else:
            inp = width * len(GROUPS) if self.shared_inputs else width
            self.heads = nn.ModuleList(_mlp(inp, hidden, 2 * d) for _ in range(experts))
        # one attention query an expert over the history (module docstring); None: experts read their
        # group, or every group with shared_inputs
        self.interests = (nn.Sequential(nn.Linear(width, hidden), nn.Tanh(), nn.Linear(hidden, experts, bias=False))
                          if interest_experts and experts > 1 else None)
        self.ad = nn.Embedding(n_ads, d)
        nn.init.normal_(self.ad.weight, std=0.3)
        self.ad_bias = nn.Parameter(torch.zeros(n_ads))
        self.ad_feat = AdFeatures(n_cats, d) if ad_features else None

    def ad_rows(self, cand, ad_cats):
        """``(a [C, d], b [C])`` of candidate slots ``cand``: the ad's id embedding and bias, plus (with
        ``ad_features``) a learned projection of its categories (:class:`AdFeatures`)."""
        a, b = self.ad(cand), self.ad_bias[cand]
        if self.ad_feat is not None:
            fa, fb = self.ad_feat(ad_cats[cand])
            a, b = a + fa, b + fb
        return a, b

    def request(self, batch: dict, ad_cats):
        """``(V [B, E, d], G [B, E, d], gamma [B, d], beta [B, d])``."""
        f = self.features(batch, ad_cats)
        gamma, beta = self.film(batch["ctx"])
        if self.experts == 1:
            V = self.tower(torch.cat([f[g] for g in GROUPS], dim=1))[:, None, :]
            G = torch.zeros_like(V)
        else:
            if self.interests is not None:
                inputs = self.interest_views(f)
            elif self.shared_inputs:
                inputs = [torch.cat([f[g] for g in GROUPS], dim=1)] * self.experts
            else:
                inputs = [f[g] for g in GROUPS]
            out = torch.stack([head(inputs[e]) for e, head in enumerate(self.heads)], dim=1)
            V, G = out[..., : self.d], out[..., self.d:]
        return V, G, gamma, beta

    def interest_views(self, f: dict) -> torch.Tensor:
        """``[E, B, width]``: expert e's attention-pooled history (zero for an empty history)."""
        emb, mask = f["_hist_emb"], f["_hist_mask"]  # [B, L, width], [B, L]
        w = history_softmax(self.interests(emb).transpose(1, 2), mask)  # [B, E, L]
        return torch.einsum("bel,blw->ebw", w, emb)

    def score(self, batch: dict, cand, ad_cats, return_gate: bool = False):
        V, G, gamma, beta = self.request(batch, ad_cats)
        return gated_scores(V, G, gamma, beta, *self.ad_rows(cand, ad_cats), self.k_experts, return_gate)


class RankingNet(nn.Module):
    """The ranking model (quality anchor): per (user, ad) pair, DIN-style target attention of the
    candidate ad over the user's history, DLRM-style elementwise interactions between the ad and
    the user / attended-history / context vectors, the history's affinity to the ad's categories,
    and a top MLP. Far more work per ad than a retrieval model (``flops_per_pair``)."""

    def __init__(self, n_users, n_ads, demo_cards, n_cats, ctx_cards, d: int = 64, width: int = 64,
                 hidden: int = 128, ad_features: bool = False):
        super().__init__()
        self.d = d
        self.features = UserFeatures(n_users, n_ads, demo_cards, n_cats, width)
        self.user = _mlp(width * len(GROUPS), 2 * hidden, d)
        self.ctx = nn.ModuleList(nn.Embedding(int(c), d) for c in ctx_cards)
        for e in self.ctx:
            nn.init.normal_(e.weight, std=0.1)
        self.key = nn.Linear(width, d)
        self.ad = nn.Embedding(n_ads, d)
        nn.init.normal_(self.ad.weight, std=0.3)
        self.ad_bias = nn.Parameter(torch.zeros(n_ads))
        self.ad_feat = AdFeatures(n_cats, d) if ad_features else None
        self.top = _mlp(3 * d + 2, hidden, 1)

    def flops_per_pair(self, hist_len: int) -> int:
        """Multiply-adds per (user, ad) pair x 2: attention 2*L*d, interactions 3d, category
        match, the top MLP."""
        d, h = self.d, self.top[0].out_features
        return 2 * (2 * hist_len * d + 3 * d + self.features.cat.in_features + (3 * d + 2) * h + h)

    def user_state(self, batch: dict, ad_cats):
        f = self.features(batch, ad_cats)
        u = self.user(torch.cat([f[g] for g in GROUPS], dim=1))
        c = sum(e(batch["ctx"][:, j]) for j, e in enumerate(self.ctx))
        keys = self.key(f["_hist_emb"])
        return u, c, keys, f["_hist_mask"], f["_profile"]

    def score_state(self, state, cand, ad_cats):
        u, c, keys, mask, profile = state
        e, bias = self.ad(cand), self.ad_bias[cand]  # [C, d], [C]
        if self.ad_feat is not None:
            fe, fb = self.ad_feat(ad_cats[cand])
            e, bias = e + fe, bias + fb
        att_logit = torch.einsum("bld,cd->bcl", keys, e) / math.sqrt(self.d)
        neg = (1.0 - mask)[:, None, :] * -1e4
        w = history_softmax(att_logit, mask)
        att = torch.einsum("bcl,bld->bcd", w, keys)
        maxsim = (att_logit + neg).amax(-1).clamp(min=-10.0) * (mask.sum(1) > 0).float()[:, None]
        catmatch = profile @ ad_cats[cand].T  # [B, C]
        z = torch.cat([u[:, None, :] * e[None], att * e[None], c[:, None, :] * e[None],
                       maxsim[..., None], catmatch[..., None]], dim=-1)
        return self.top(z).squeeze(-1) + bias[None, :]

    def score(self, batch: dict, cand, ad_cats, return_gate: bool = False):
        return self.score_state(self.user_state(batch, ad_cats), cand, ad_cats)
