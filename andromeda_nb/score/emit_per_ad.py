"""Emitters of the generated scoring kernel's per-ad part (:mod:`.fused`, step 4): the ad's row,
then the model, gated (context encoding, gate logits, softmax, the K chosen experts and their
value dots) or the dot product, then the score. A mixin of :class:`.fused._Source`: the methods
read its shape (``d``, ``E``, ``K``, ``dtype``, ``model``, ...) and append lines through ``emit``.
"""

from __future__ import annotations

from ..device.intrinsics import LOG2E


class PerAdEmitter:
    """Step 4 of a generated kernel, per ad (its attributes are :class:`.fused._Source`'s)."""

    def _per_ad(self) -> None:
        emit = self.emit
        emit("        if ok:")
        ind = "            "
        emit(f"{ind}us = uint64(slot)")  # unsigned index: no negative-index wraparound code
        self._row(ind)
        if self.model == "dot":
            self._dot(ind)
        else:
            self._gated(ind)

    def _row(self, ind: str) -> None:
        """The ad's row as x0..x{d-1} (fp32), or for the tensor cores its logits and values."""
        emit, d, W = self.emit, self.d, self.W
        if self.mma:  # this thread's ad is row `lane` of its warp's tile: E logits, E values
            from .fused import MSC_PITCH

            emit(f"{ind}mo = mw + lane * {MSC_PITCH}")
            for name, off in (("l", 0), ("a", 8)):  # in 16-, 8- and 4-byte loads
                e = 0
                while e < self.E:
                    width = 4 if self.E - e >= 4 else 2 if self.E - e >= 2 else 1
                    names = ", ".join(f"{name}{e + i}" for i in range(width))
                    emit(f"{ind}{names} = " + (f"msc[mo + {off + e}]" if width == 1 else
                                               f"lds{width}(msc, mo + {off + e})"))
                    e += width
        else:  # this thread's own row: all loads first, then the widening
            for w in range(d // W):
                idx = f"us, {w}" if self.layout == "rows" else f"{w}, us"
                emit(f"{ind}w{w} = words[{idx}]")
            for w in range(d // W):
                names = ", ".join(f"x{w * W + i}" for i in range(W))
                emit(f"{ind}{names} = decode(w{w})")
        # int8: the dot kernel multiplies its sum by the row scale once (sum_i u_i (s x_i) = s
        # sum_i u_i x_i); the gated kernel needs s x_i itself, inside the ReLU
        if self.dtype == "int8" and not self.mma:
            emit(f"{ind}rs = scale[us]")
            for i in range(d if not self._int8_dot() else 0):
                emit(f"{ind}x{i} = x{i} * rs")

    def _int8_dot(self) -> bool:
        return self.dtype == "int8" and self.model == "dot"

    def _dot(self, ind: str) -> None:
        """s = dot(u, a) + b (the two-tower baseline)."""
        emit, d = self.emit, self.d
        if self.param_weights:
            for i in range(d):
                emit(f"{ind}acc = x{i} * wt[{i}]" if i == 0 else f"{ind}acc = acc + x{i} * wt[{i}]")
        else:
            for q in range(d // 4):
                emit(f"{ind}u0, u1, u2, u3 = lds4(wsh, wo + {4 * q})")
                for t in range(4):
                    i = 4 * q + t
                    emit(f"{ind}acc = x{i} * u{t}" if i == 0 else f"{ind}acc = acc + x{i} * u{t}")
        emit(f"{ind}s = acc * rs + bias[us]" if self._int8_dot() else f"{ind}s = acc + bias[us]")

    def _gated(self, ind: str) -> None:
        """The model of docs/design.md: h = relu(gamma * a + beta); logits = G h / sqrt(d);
        softmax over E; the K best experts' value dots weighted by their p; plus the bias."""
        if self.param_weights:
            self._encode_and_gate_from_params(ind)
        elif not self.mma:
            self._encode_and_gate_from_shared(ind)
        self._softmax(ind)
        self._choose_and_combine(ind)

    def _encode_and_gate_from_params(self, ind: str) -> None:
        emit, d = self.emit, self.d
        for i in range(d):
            emit(f"{ind}h{i} = max_nan(x{i} * wt[{i}] + wt[{self.o_beta + i}], zero)")
        for e in range(self.E):
            for i in range(d):
                w = f"wt[{self.o_g + e * d + i}]"
                emit(f"{ind}l{e} = h{i} * {w}" if i == 0 else f"{ind}l{e} = l{e} + h{i} * {w}")

    def _encode_and_gate_from_shared(self, ind: str) -> None:
        """h and the E logits four dimensions at a time (16-byte weight loads); with values="all"
        every expert's value dot in the same pass (h need not stay live)."""
        emit, d = self.emit, self.d
        for q in range(d // 4):
            emit(f"{ind}g0, g1, g2, g3 = lds4(wsh, wo + {4 * q})")
            emit(f"{ind}c0, c1, c2, c3 = lds4(wsh, wo + {self.o_beta + 4 * q})")
            for t in range(4):
                i = 4 * q + t
                emit(f"{ind}h{i} = max_nan(x{i} * g{t} + c{t}, zero)")
            terms = " + ".join(f"h{4 * q + t} * q{t}" for t in range(4))
            for e in range(self.E):
                emit(f"{ind}q0, q1, q2, q3 = lds4(wsh, wo + {self.o_g + e * d + 4 * q})")
                emit(f"{ind}l{e} = {terms}" if q == 0 else f"{ind}l{e} = l{e} + {terms}")
            if self.values == "all":
                for e in range(self.E):
                    emit(f"{ind}q0, q1, q2, q3 = lds4(wsh, {self.o_v + e * self.pitch + 4 * q})")
                    emit(f"{ind}a{e} = {terms}" if q == 0 else f"{ind}a{e} = a{e} + {terms}")

    def _softmax(self, ind: str) -> None:
        """p[e] = exp(l[e] - m) (unnormalised; z their sum)."""
        emit, E = self.emit, self.E
        if self.choice == "insert":  # m is the first slot's logit: the same chain of strict compares
            self._insert(ind)
            emit(f"{ind}m = sl0")
        else:
            emit(f"{ind}m = l0")
            for e in range(1, E):
                emit(f"{ind}if l{e} > m:")
                emit(f"{ind}    m = l{e}")
        if self.fast_softmax:  # exp(l - m) = 2^(l log2 e - m log2 e): an FFMA an expert (exp_shifted)
            emit(f"{ind}nm = m * float32({-LOG2E!r})")
        for e in range(E):
            emit(f"{ind}p{e} = {self._exp(f'l{e}')}")
        emit(f"{ind}z = " + " + ".join(f"p{e}" for e in range(E)))

    def _exp(self, logit: str) -> str:
        """exp(logit - m), the softmax's weight of a logit (after :meth:`_softmax` set m)."""
        return f"exp_shifted({logit}, nm)" if self.fast_softmax else f"math.exp({logit} - m)"

    def _insert(self, ind: str) -> None:
        """The K best experts in one pass over the E logits: slots ``sl0 >= ... >= sl{K-1}`` (logit)
        and ``sv*`` (value dot); expert e goes into the first slot whose logit it beats strictly,
        the slots below shift down, or into slot e while fewer than K are seen. Slot r then holds
        what the r-th of K passes picks (each pass: the first expert not taken, replaced by a
        strictly larger logit), NaN logits included: over a prefix of the experts, slot r is pass r
        over that prefix, and adding expert e keeps it so (a pass passes over e unless e beats its
        pick strictly or it has none)."""
        emit, E, K = self.emit, self.E, self.K
        emit(f"{ind}sl0 = l0")
        emit(f"{ind}sv0 = a0")
        # branch-free: with c_r = (l_e > sl_r) and an empty slot's c taken as true, slot t becomes
        # sl_{t-1} if some c_{r<t} holds (it shifts down), else l_e if c_t, else stays; written as
        # selects, since lanes of a warp take different branches of the if / elif chain this is
        # (both paths issued) and the chain compiled to branches even at E6 K2
        for e in range(1, E):
            filled = min(e, K)
            for r in range(filled):
                emit(f"{ind}c{r} = l{e} > sl{r}")
            for r in range(1, filled):
                emit(f"{ind}c{r} = c{r - 1} | c{r}")  # c_r now: some slot up to r taken by e
            for t in range(min(e, K - 1), -1, -1):  # from the bottom: each slot reads the old one above
                for slot, new in (("sl", f"l{e}"), ("sv", f"a{e}")):
                    if t == 0:
                        emit(f"{ind}{slot}0 = {new} if c0 else {slot}0")
                    elif t == e:  # the empty slot: e's own unless it took a slot above
                        emit(f"{ind}{slot}{t} = {slot}{t - 1} if c{t - 1} else {new}")
                    else:
                        emit(f"{ind}{slot}{t} = {slot}{t - 1} if c{t - 1} else ({new} if c{t} else {slot}{t})")

    def _choose_and_combine(self, ind: str) -> None:
        """The K best experts by logit (ties: the lower index), each one's value dot times its p;
        s = sum / z + bias (p is not renormalised over the chosen experts)."""
        emit, d, E, K = self.emit, self.d, self.E, self.K
        bias = "bias[us]" if self.bias_load == "end" else "bj"
        if self.choice == "ranks":
            # expert e's rank: the experts ahead of it (a larger logit, or an equal one at a lower
            # index); the chosen are ranks 0..K-1. A NaN logit makes z, so s, NaN either way
            for e in range(E):
                emit(f"{ind}r{e} = 0")
            for i in range(E):
                for j in range(i + 1, E):
                    emit(f"{ind}if l{j} > l{i}:")
                    emit(f"{ind}    r{i} += 1")
                    emit(f"{ind}else:")
                    emit(f"{ind}    r{j} += 1")
            emit(f"{ind}mixed = zero")
            for e in range(E):
                emit(f"{ind}if r{e} < {K}:")
                emit(f"{ind}    mixed += p{e} * a{e}")
            emit(f"{ind}s = {self._over_z()} + {bias}")
            return
        if self.choice == "insert":
            # the first slot is the largest logit: its weight is exp(sl0 - m) = 1 (a NaN or infinite
            # logit makes z, so s, NaN either way), the passes' first weight likewise
            emit(f"{ind}mixed = sv0" + "".join(f" + {self._exp(f'sl{r}')} * sv{r}" for r in range(1, K)))
            emit(f"{ind}s = {self._over_z()} + {bias}")
            return
        emit(f"{ind}taken = 0")
        for r in range(K):
            emit(f"{ind}b = -1" if not self.batched else f"{ind}bx = -1")
            bx = "bx" if self.batched else "b"  # a batched kernel's b is its request
            emit(f"{ind}bl = zero")
            emit(f"{ind}bp = zero")
            for e in range(E):
                emit(f"{ind}if (taken & {1 << e}) == 0 and ({bx} < 0 or l{e} > bl):")
                emit(f"{ind}    {bx} = {e}")
                emit(f"{ind}    bl = l{e}")
                emit(f"{ind}    bp = p{e}")
            emit(f"{ind}taken |= 1 << {bx}")
            if self.values == "all":
                emit(f"{ind}v{r} = a0")
                for e in range(1, E):
                    emit(f"{ind}if {bx} == {e}:")
                    emit(f"{ind}    v{r} = a{e}")
            else:
                emit(f"{ind}vb = {self.o_v} + {bx} * {self.pitch}")
                for q in range(d // 4):
                    emit(f"{ind}q0, q1, q2, q3 = lds4(wsh, vb + {4 * q})")
                    terms = " + ".join(f"h{4 * q + t} * q{t}" for t in range(4))
                    emit(f"{ind}v{r} = {terms}" if q == 0 else f"{ind}v{r} = v{r} + {terms}")
            emit(f"{ind}wp{r} = bp")
        # the first pass takes the largest logit, whose weight is exp(0) = 1: the same sum as the
        # one-pass insertion's, term by term
        emit(f"{ind}mixed = v0" + "".join(f" + wp{r} * v{r}" for r in range(1, K)))
        emit(f"{ind}s = {self._over_z()} + {bias}")

    def _over_z(self) -> str:
        """The mixture over the softmax's sum z. z lies in [1, E] (the largest logit's weight is
        exp(0) = 1) or is NaN: the fast softmax's 1 / z as rcp.approx is then the division (the
        range scaling of div.full never applies); the exact softmax divides."""
        return "mixed * rcp_approx(z)" if self.fast_softmax else "mixed / z"
