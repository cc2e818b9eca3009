"""Device intrinsics: widen one 8-byte word of a stored ad row to fp32 values, a 16-byte shared
load, and a NaN-keeping max.

Each decoder takes a ``uint64`` (one 8-byte load, 2 fp32 / 4 fp16 / 4 bf16 / 8 int8 elements,
little-endian: element 0 in the low bits) and returns a tuple of float32. They are LLVM shifts and
truncations on the 64-bit integer, so the load stays one ``LDG.E.64`` (a vector bitcast lets LLVM
split it into two 4-byte loads); fp16 widens with one ``HADD2.F32`` per element, int8 with one
``PRMT`` and one ``FADD`` (not the quarter-rate ``I2F`` conversion).

``lds4(shared_array, i)`` reads elements ``i..i+3`` of a float32 shared array (``i`` a multiple of 4,
the array 16-byte aligned) with one ``LDS.128``: Numba emits one scalar load per element, and an
indexed load with a signed index carries a negative-index wraparound check besides.

``float_key(x)`` maps a float32 to a uint32 with the same order (negative: all bits flipped;
otherwise the sign bit set; -0 sorts just below +0), the key of a radix select.

``max_nan(x, 0)`` is PTX ``max.NaN.f32`` (sm_80+, one ``FMNMX.NAN``): the ReLU that keeps NaN, as the
oracle's ``np.maximum`` does.

The simulator gets numpy versions with the same results (it runs kernels as Python).
"""

import numpy as np
from numba.cuda.core import config

#: keeps sign, exponent and the 10 mantissa bits of TensorFloat-32
TF32_MASK = 0xFFFFE000
#: log2(e) rounded to fp32 (exp_shifted: exp(x) = 2^(x log2 e))
LOG2E = 1.4426950408889634

if config.ENABLE_CUDASIM:

    def _u64(x):
        return np.array([int(x) & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64)

    def decode_fp32(x):
        a, b = _u64(x).view(np.float32)
        return a, b

    def decode_fp16(x):
        a, b, c, d = _u64(x).view(np.float16).astype(np.float32)
        return a, b, c, d

    def decode_bf16(x):
        a, b, c, d = (_u64(x).view(np.uint16).astype(np.uint32) << 16).view(np.float32)
        return a, b, c, d

    def decode_int8(x):
        v = _u64(x).view(np.int8).astype(np.float32)
        return v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]

    def max_nan(a, b):
        a, b = np.float32(a), np.float32(b)
        return np.float32(np.nan) if (np.isnan(a) or np.isnan(b)) else max(a, b)

    def lds4(arr, i):
        i = int(i)
        return arr[i], arr[i + 1], arr[i + 2], arr[i + 3]

    def lds2(arr, i):
        i = int(i)
        return arr[i], arr[i + 1]

    def sts2(arr, i, a, b):
        i = int(i)
        arr[i], arr[i + 1] = a, b

    def float_key(x):
        u = int(np.array([x], dtype=np.float32).view(np.uint32)[0])
        return np.uint32(u ^ 0xFFFFFFFF if u & 0x80000000 else u | 0x80000000)

    def tf32_round(x):
        return tf32_round_host(np.array([x], dtype=np.float32))[0]

    def mma_tf32(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        raise RuntimeError("mma_tf32 is warp-collective: the simulator runs kernels through mma_tf32_warp")

    def mma_f16(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        raise RuntimeError("mma_f16 is warp-collective: the simulator runs kernels through mma_f16_warp")

    def film_h2(x, g, b):
        return film_h2_host(np.array([x], np.uint32), np.array([g], np.uint32), np.array([b], np.uint32))[0]

    def half2_of(s):
        return half2_of_host(np.array([s], np.float32))[0]

    def dequant_i8x4(x, s2):
        lo, hi = dequant_i8x4_host(np.array([x], np.uint32), np.array([s2], np.uint32))
        return lo[0], hi[0]

    def dequant_offset_h2(s2):
        return dequant_offset_h2_host(np.array([s2], np.uint32))[0]

    def pair_low(p):
        return np.uint32((int(p) & 0xFFFF) * 0x10001)

    def pair_high(p):
        return np.uint32((int(p) >> 16) * 0x10001)

    def dequant_i8x4_fma(x, s2, c2):
        lo, hi = dequant_i8x4_fma_host(np.array([x], np.uint32), np.array([s2], np.uint32),
                                       np.array([c2], np.uint32))
        return lo[0], hi[0]

    def exp_shifted(x, c):
        with np.errstate(over="ignore", invalid="ignore"):  # the product exact in float64, one rounding
            return np.float32(np.exp2(np.float32(np.float64(np.float32(x)) * np.float64(np.float32(LOG2E))
                                                 + np.float64(c))))

    def rcp_approx(x):
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            return np.float32(np.float32(1.0) / np.float32(x))

else:
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    _I64 = ir.IntType(64)

    def _fields(builder, x, width):
        out = []
        for i in range(64 // width):
            shifted = builder.lshr(x, ir.Constant(_I64, width * i)) if i else x
            out.append(builder.trunc(shifted, ir.IntType(width)))
        return out

    @intrinsic
    def decode_fp32(typingctx, x):
        sig = types.UniTuple(types.float32, 2)(types.uint64)

        def codegen(context, builder, sig, args):
            vals = [builder.bitcast(f, ir.FloatType()) for f in _fields(builder, args[0], 32)]
            return context.make_tuple(builder, sig.return_type, vals)

        return sig, codegen

    @intrinsic
    def decode_fp16(typingctx, x):
        sig = types.UniTuple(types.float32, 4)(types.uint64)

        def codegen(context, builder, sig, args):
            # split into 32-bit halves, then <2 x half>: PTX mov.b32 {h0, h1}, so SASS widens each
            # half with one HADD2.F32 using the .H0_H0 / .H1_H1 selectors (no extra shifts)
            vals = []
            for word in _fields(builder, args[0], 32):
                pair = builder.bitcast(word, ir.VectorType(ir.HalfType(), 2))
                for k in range(2):
                    half = builder.extract_element(pair, ir.Constant(ir.IntType(32), k))
                    vals.append(builder.fpext(half, ir.FloatType()))
            return context.make_tuple(builder, sig.return_type, vals)

        return sig, codegen

    @intrinsic
    def decode_bf16(typingctx, x):
        sig = types.UniTuple(types.float32, 4)(types.uint64)

        def codegen(context, builder, sig, args):
            vals = []
            for f in _fields(builder, args[0], 16):
                wide = builder.shl(builder.zext(f, ir.IntType(32)), ir.Constant(ir.IntType(32), 16))
                vals.append(builder.bitcast(wide, ir.FloatType()))
            return context.make_tuple(builder, sig.return_type, vals)

        return sig, codegen

    _I32 = ir.IntType(32)
    _PRMT = ir.InlineAsm(ir.FunctionType(_I32, [_I32, _I32, _I32]), "prmt.b32 $0, $1, $2, $3;", "=r,r,r,r")

    @intrinsic
    def decode_int8(typingctx, x):
        sig = types.UniTuple(types.float32, 8)(types.uint64)

        def codegen(context, builder, sig, args):
            # sitofp compiles to I2F, a conversion at 16 results / clock / SM on sm_90: 64 of them
            # an ad at d = 64 bound the int8 kernels near 6.5e10 ads/s. Instead, per byte: one PRMT
            # builds the fp32 bits 0x4B0000bb (= 2^23 + bb exactly) and one FADD subtracts 2^23 + 128,
            # where bb = v + 128 (the byte with its sign bit flipped, one XOR per 4 bytes): exact for
            # every int8 v, on the full-rate integer and fp32 pipes
            vals = []
            magic = ir.Constant(_I32, 0x4B000000)
            offset = ir.Constant(ir.FloatType(), 8388736.0)
            for word in _fields(builder, args[0], 32):
                biased = builder.xor(word, ir.Constant(_I32, 0x80808080))
                for k in range(4):
                    bits = builder.call(_PRMT, [biased, magic, ir.Constant(_I32, 0x7540 + k)])
                    vals.append(builder.fsub(builder.bitcast(bits, ir.FloatType()), offset))
            return context.make_tuple(builder, sig.return_type, vals)

        return sig, codegen

    @intrinsic
    def max_nan(typingctx, a, b):
        sig = types.float32(types.float32, types.float32)

        def codegen(context, builder, sig, args):
            fnty = ir.FunctionType(ir.FloatType(), [ir.FloatType(), ir.FloatType()])
            asm = ir.InlineAsm(fnty, "max.NaN.f32 $0, $1, $2;", "=f,f,f")
            return builder.call(asm, args)

        return sig, codegen


    def _vector_pointer(context, builder, sig, args, n: int):
        """The address of float32 element ``args[1]`` of array ``args[0]`` as a pointer to ``n``
        floats (the caller keeps it aligned to ``4 n`` bytes)."""
        ary = context.make_array(sig.args[0])(context, builder, value=args[0])
        idx = builder.sext(args[1], _I64) if args[1].type.width < 64 else args[1]
        return builder.bitcast(builder.gep(ary.data, [idx]), ir.PointerType(ir.VectorType(ir.FloatType(), n)))

    def _vector_load(n: int):
        """An intrinsic loading ``n`` float32 from ``arr[i]`` on in one ``4 n``-byte load (``i`` a
        multiple of ``n``), returned as a tuple."""
        def load(typingctx, arr, i):
            if not isinstance(arr, types.Array) or arr.dtype != types.float32 or not isinstance(i, types.Integer):
                return None
            sig = types.UniTuple(types.float32, n)(arr, i)

            def codegen(context, builder, sig, args):
                vec = builder.load(_vector_pointer(context, builder, sig, args, n), align=4 * n)
                vals = [builder.extract_element(vec, ir.Constant(ir.IntType(32), k)) for k in range(n)]
                return context.make_tuple(builder, sig.return_type, vals)

            return sig, codegen

        load.__name__ = load.__qualname__ = f"lds{n}"
        return intrinsic(load)

    lds2, lds4 = _vector_load(2), _vector_load(4)

    @intrinsic
    def sts2(typingctx, arr, i, a, b):
        """``arr[i], arr[i + 1] = a, b`` in one 8-byte store (i even)."""
        if not isinstance(arr, types.Array) or arr.dtype != types.float32 or not isinstance(i, types.Integer):
            return None
        sig = types.void(arr, i, types.float32, types.float32)

        def codegen(context, builder, sig, args):
            vt = ir.VectorType(ir.FloatType(), 2)
            vec = builder.insert_element(ir.Constant(vt, ir.Undefined), args[2], ir.Constant(ir.IntType(32), 0))
            vec = builder.insert_element(vec, args[3], ir.Constant(ir.IntType(32), 1))
            builder.store(vec, _vector_pointer(context, builder, sig, args, 2), align=8)
            return context.get_dummy_value()

        return sig, codegen

    @intrinsic
    def float_key(typingctx, x):
        sig = types.uint32(types.float32)

        def codegen(context, builder, sig, args):
            bits = builder.bitcast(args[0], ir.IntType(32))
            sign = builder.ashr(bits, ir.Constant(ir.IntType(32), 31))  # all ones if negative
            flip = builder.or_(sign, ir.Constant(ir.IntType(32), 0x80000000))
            return builder.xor(bits, flip)

        return sig, codegen

    @intrinsic
    def tf32_round(typingctx, x):
        sig = types.float32(types.float32)

        def codegen(context, builder, sig, args):
            fnty = ir.FunctionType(ir.IntType(32), [ir.FloatType()])
            asm = ir.InlineAsm(fnty, "cvt.rna.tf32.f32 $0, $1;", "=r,f")
            # the low 13 bits cleared explicitly, whatever the conversion leaves there
            bits = builder.and_(builder.call(asm, args), ir.Constant(ir.IntType(32), TF32_MASK))
            return builder.bitcast(bits, ir.FloatType())

        return sig, codegen

    @intrinsic
    def mma_tf32(typingctx, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        f32 = types.float32
        sig = types.UniTuple(f32, 4)(*([f32] * 10))

        def codegen(context, builder, sig, args):
            i32, f = ir.IntType(32), ir.FloatType()
            ins = [builder.bitcast(a, i32) for a in args[:6]] + list(args[6:])
            ret = ir.LiteralStructType([f] * 4)
            fnty = ir.FunctionType(ret, [i32] * 6 + [f] * 4)
            asm = ir.InlineAsm(fnty, "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
                               "{$0, $1, $2, $3}, {$4, $5, $6, $7}, {$8, $9}, {$10, $11, $12, $13};",
                               "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f")
            out = builder.call(asm, ins)
            vals = [builder.extract_value(out, k) for k in range(4)]
            return context.make_tuple(builder, sig.return_type, vals)

        return sig, codegen


    @intrinsic
    def mma_f16(typingctx, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        u32, f32 = types.uint32, types.float32
        sig = types.UniTuple(f32, 4)(*([u32] * 6 + [f32] * 4))

        def codegen(context, builder, sig, args):
            i32, f = ir.IntType(32), ir.FloatType()
            ret = ir.LiteralStructType([f] * 4)
            fnty = ir.FunctionType(ret, [i32] * 6 + [f] * 4)
            asm = ir.InlineAsm(fnty, "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                               "{$0, $1, $2, $3}, {$4, $5, $6, $7}, {$8, $9}, {$10, $11, $12, $13};",
                               "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f")
            out = builder.call(asm, list(args))
            vals = [builder.extract_value(out, k) for k in range(4)]
            return context.make_tuple(builder, sig.return_type, vals)

        return sig, codegen

    @intrinsic
    def film_h2(typingctx, x, g, b):
        sig = types.uint32(types.uint32, types.uint32, types.uint32)

        def codegen(context, builder, sig, args):
            i32 = ir.IntType(32)
            fnty = ir.FunctionType(i32, [i32, i32, i32])
            # h = max(x * g + b, 0) on two halves at once, rounded once to fp16, a NaN kept (as the
            # canonical NaN): one HFMA2.RELU instead of an HFMA2 and an HMNMX2
            asm = ir.InlineAsm(fnty, "fma.rn.relu.f16x2 $0, $1, $2, $3;", "=r,r,r,r")
            return builder.call(asm, list(args))

        return sig, codegen


    @intrinsic
    def half2_of(typingctx, s):
        sig = types.uint32(types.float32)

        def codegen(context, builder, sig, args):
            fnty = ir.FunctionType(ir.IntType(32), [ir.FloatType()])
            # the row scale, at most fp16's largest finite (65504 = 0f477FE000), rounded to fp16 (cvt.rn),
            # in both halves of a word: a scale past fp16 times q = 0 stays 0 (a row with any q != 0
            # at such a scale is refused up front: fp16_rows_fit)
            asm = ir.InlineAsm(fnty, "{ .reg .b16 h; .reg .f32 t; min.f32 t, $1, 0f477FE000; cvt.rn.f16.f32 h, t; "
                               "mov.b32 $0, {h, h}; }", "=r,f")
            return builder.call(asm, list(args))

        return sig, codegen

    def _two_words(n_in: int, text: str):
        """(signature, codegen) of an intrinsic of ``n_in`` uint32 arguments whose inline PTX
        ``text`` writes two uint32 results ($0, $1; the arguments are $2...)."""
        sig = types.UniTuple(types.uint32, 2)(*([types.uint32] * n_in))

        def codegen(context, builder, sig, args):
            i32 = ir.IntType(32)
            fnty = ir.FunctionType(ir.LiteralStructType([i32, i32]), [i32] * n_in)
            asm = ir.InlineAsm(fnty, text, "=&r,=&r," + ",".join(["r"] * n_in))
            out = builder.call(asm, list(args))
            vals = [builder.extract_value(out, k) for k in range(2)]
            return context.make_tuple(builder, sig.return_type, vals)

        return sig, codegen

    #: the int8 bytes of a word as fp16 pairs with 1152 added: the byte with its sign bit flipped,
    #: bb = q + 128, becomes the fp16 bits 0x64bb = 1024 + bb exactly (one PRMT a pair)
    _BIASED_PAIRS = ("xor.b32 t, $2, 0x80808080; mov.b32 m, 0x64646464; "
                     "prmt.b32 $0, t, m, 0x4140; prmt.b32 $1, t, m, 0x4342; ")

    @intrinsic
    def dequant_i8x4(typingctx, x, s2):
        # four int8 q (byte 0 lowest) -> fp16 pairs (q0, q1), (q2, q3) times the fp16 scale in s2:
        # 1152 + q, minus 1152 = q exactly (HADD2), times s rounded once (HMUL2)
        return _two_words(2, "{ .reg .b32 t, m, c; " + _BIASED_PAIRS + "mov.b32 c, 0x64806480; "
                          "sub.f16x2 $0, $0, c; sub.f16x2 $1, $1, c; "
                          "mul.rn.f16x2 $0, $0, $3; mul.rn.f16x2 $1, $1, $3; }")


    @intrinsic
    def dequant_offset_h2(typingctx, s2):
        sig = types.uint32(types.uint32)

        def codegen(context, builder, sig, args):
            fnty = ir.FunctionType(ir.IntType(32), [ir.IntType(32)])
            # c = -1152 * s in both halves (0xE480 is -1152 in fp16), once a row
            asm = ir.InlineAsm(fnty, "{ .reg .b32 k; mov.b32 k, 0xE480E480; mul.rn.f16x2 $0, $1, k; }", "=r,r")
            return builder.call(asm, list(args))

        return sig, codegen

    def _half_pair(which: str):
        def typer(typingctx, p):
            if not isinstance(p, types.Integer):
                return None
            sig = types.uint32(p)

            def codegen(context, builder, sig, args):
                fnty = ir.FunctionType(ir.IntType(32), [ir.IntType(32)])
                # one half of a word in both halves: ptxas folds the move into the reading
                # instruction's operand (an HFMA2's .H0_H0 / .H1_H1), no instruction of its own
                asm = ir.InlineAsm(fnty, "{ .reg .b16 l, h; mov.b32 {l, h}, $1; "
                                   f"mov.b32 $0, {{{which}, {which}}}; }}", "=r,r")
                return builder.call(asm, [builder.trunc(args[0], ir.IntType(32))
                                          if args[0].type.width > 32 else args[0]])

            return sig, codegen

        typer.__name__ = typer.__qualname__ = {"l": "pair_low", "h": "pair_high"}[which]
        return typer

    #: a table's packed scale word (fp16 s low, fp16 -1152 s high: scale_pairs_host) as the two
    #: half2 operands dequant_i8x4(_fma) take
    pair_low = intrinsic(_half_pair("l"))
    pair_high = intrinsic(_half_pair("h"))

    @intrinsic
    def dequant_i8x4_fma(typingctx, x, s2, c2):
        # dequant_i8x4 with its subtract and multiply fused: (1152 + q) * s + c, c = -1152 s
        # (dequant_offset_h2), is q * s rounded once (a zero scale: +0 for -0), whenever c is exact
        # (fma_dequant_exact: every scale of the table has at most 7 significant bits): one HFMA2
        # a pair instead of an HADD2 and an HMUL2
        return _two_words(3, "{ .reg .b32 t, m; " + _BIASED_PAIRS
                          + "fma.rn.f16x2 $0, $0, $3, $4; fma.rn.f16x2 $1, $1, $3, $4; }")

    @intrinsic
    def exp_shifted(typingctx, x, c):
        """exp(x - m) as ``ex2.approx.ftz(fma(x, log2 e, c))`` with ``c = -m log2 e`` made once: a
        softmax's E exponentials in one FFMA and one MUFU.EX2 each, where ``x - m`` first took an
        FADD and an FMUL (libdevice's exp ~10 instructions). Relative error ~2^-22 plus the FFMA's
        rounding (|x - m| 2^-24 log2 e); results below 2^-126 flushed to zero (softmax weights
        there are 1e-38 of the largest). c's own rounding scales every exponential of the same m
        by the same 2^delta (|delta| <= |m log2 e| 2^-24): a softmax's weights p / z keep their
        values, but for the largest logit's, which a kernel takes as exactly exp(0) = 1 and is then
        off by |delta| ln 2 relative, as much as that logit's own fp32 rounding moves it."""
        sig = types.float32(types.float32, types.float32)

        def codegen(context, builder, sig, args):
            fnty = ir.FunctionType(ir.FloatType(), [ir.FloatType(), ir.FloatType()])
            asm = ir.InlineAsm(fnty, "{ .reg .f32 t; fma.rn.f32 t, $1, 0f3FB8AA3B, $2; ex2.approx.ftz.f32 $0, t; }",
                               "=f,f,f")
            return builder.call(asm, list(args))

        return sig, codegen

    @intrinsic
    def rcp_approx(typingctx, x):
        """1 / x as ``rcp.approx.ftz.f32`` (one MUFU.RCP, at most 1 ulp off; subnormals flushed):
        for the softmax's sum, which lies in [1, E] or is NaN, where ``div.full`` (or the IEEE
        division) adds range checks that never fire."""
        sig = types.float32(types.float32)

        def codegen(context, builder, sig, args):
            fnty = ir.FunctionType(ir.FloatType(), [ir.FloatType()])
            return builder.call(ir.InlineAsm(fnty, "rcp.approx.ftz.f32 $0, $1;", "=f,f"), list(args))

        return sig, codegen


def half2_of_host(s) -> np.ndarray:
    """The float32 ``s``, at most 65504 (fp16's largest finite), rounded to fp16 (round to nearest
    even) in both halves of a uint32 word."""
    h = np.minimum(np.asarray(s, np.float32), np.float32(65504.0)).astype(np.float16)
    return np.ascontiguousarray(np.stack([h, h], axis=-1)).view(np.uint32).reshape(np.shape(s))


def dequant_i8x4_host(x, s2) -> tuple[np.ndarray, np.ndarray]:
    """Words of four int8 (byte 0 lowest) to two words of fp16 pairs ``q * s``: the product of q and
    the fp16 scale (the low half of ``s2``) exact, rounded once to fp16, as ``mul.rn.f16x2``. Used
    by the simulator; the fp16-math reference computes the same values (:func:`~andromeda_nb.reference.gate`)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return _pair_words(_int8_values(x) * _halves(s2)[:, :1])


def _int8_values(x) -> np.ndarray:
    """uint32 words of four int8 (byte 0 lowest) as float64 ``[n, 4]``."""
    return np.ascontiguousarray(np.asarray(x, np.uint32)).view(np.int8).reshape(-1, 4).astype(np.float64)


def _pair_words(v) -> tuple[np.ndarray, np.ndarray]:
    """float64 ``[n, 4]`` rounded once to fp16, as two uint32 words of pairs (values 0, 1 and 2, 3)."""
    a = np.ascontiguousarray(np.asarray(v).astype(np.float16))
    return a[:, :2].copy().view(np.uint32).reshape(-1), a[:, 2:].copy().view(np.uint32).reshape(-1)


def _halves(w) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(w, np.uint32)).view(np.float16).reshape(-1, 2).astype(np.float64)


def scale_pairs_host(scale) -> np.ndarray:
    """Each float32 row scale as the word fp16 math reads (``KernelConfig.row_scales``, by default):
    the low half the scale as :func:`half2_of_host` rounds it, the high half that times -1152 as
    :func:`dequant_offset_h2_host` rounds it; the same bits the kernel otherwise makes each round."""
    s2 = half2_of_host(np.asarray(scale, np.float32).reshape(-1))
    return (s2 & np.uint32(0xFFFF)) | (dequant_offset_h2_host(s2) & np.uint32(0xFFFF0000))


def dequant_offset_h2_host(s2) -> np.ndarray:
    """``mul.rn.f16x2(s2, -1152)`` on uint32 words of two fp16 each (exact in float64, rounded
    once to fp16, inf past its range)."""
    with np.errstate(over="ignore", invalid="ignore"):
        c = (_halves(s2) * -1152.0).astype(np.float16)
    return np.ascontiguousarray(c).view(np.uint32).reshape(-1)


def dequant_i8x4_fma_host(x, s2, c2) -> tuple[np.ndarray, np.ndarray]:
    """Words of four int8 (byte 0 lowest) to two words of fp16 pairs ``(1152 + q) * s + c``
    (``s`` and ``c`` the low halves of ``s2`` and ``c2``), the product and sum exact in float64 and
    rounded once to fp16, as ``fma.rn.f16x2``: :func:`dequant_i8x4_host`'s bits when ``c`` is
    ``-1152 s`` exactly."""
    with np.errstate(over="ignore", invalid="ignore"):
        return _pair_words((1152.0 + _int8_values(x)) * _halves(s2)[:, :1] + _halves(c2)[:, :1])


def film_h2_host(x, g, b) -> np.ndarray:
    """``fma.rn.relu.f16x2(x, g, b)`` (``max.NaN(fma, 0)``) on uint32 words of two fp16 each: the
    product and sum exact in float64, rounded once to fp16 (as the hardware's fused multiply-add), NaN kept.
    Used by the simulator and the fp16-math reference."""
    def halves(w):
        return np.ascontiguousarray(np.asarray(w, np.uint32)).view(np.float16).astype(np.float64)

    with np.errstate(invalid="ignore", over="ignore"):
        h = (halves(x) * halves(g) + halves(b)).astype(np.float16)
    h = np.where(np.isnan(h) | (h > 0), h, np.float16(0))
    return np.ascontiguousarray(h.astype(np.float16)).view(np.uint32)


def mma_f16_warp(frag_ab, frag_c, lane):
    """Simulator model of one warp's ``mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32``:
    ``frag_ab[32, 6]`` (uint32) holds every lane's a0..a3, b0, b1 (words of two fp16, the lower
    element in the low half) and ``frag_c[32, >= 4]`` (float32) its c0..c3 first; returns lane ``lane``'s
    d0..d3 as float32, the products exact and summed in float64, rounded once to fp32 (the
    hardware's fp32 accumulation may round differently). Fragment layout (PTX ISA, "Matrix
    Fragments for mma.m16n8k16", .f16; g = lane // 4, c = lane % 4): a0 = A[g, 2c:2c+2],
    a1 = A[g+8, 2c:2c+2], a2 = A[g, 2c+8:2c+10], a3 = A[g+8, 2c+8:2c+10]; b0 = B[2c:2c+2, g],
    b1 = B[2c+8:2c+10, g]; c0, c1 = C[g, 2c], C[g, 2c+1]; c2, c3 = C[g+8, 2c], C[g+8, 2c+1]."""
    u = np.ascontiguousarray(frag_ab, dtype=np.uint32)
    h = u.view(np.float16).astype(np.float64).reshape(32, 6, 2)
    f = np.asarray(frag_c, dtype=np.float32)
    A = np.zeros((16, 16))
    B = np.zeros((16, 8))
    C = np.zeros((16, 8))
    A[_F16_A] = h[:, :4]
    B[_F16_B] = h[:, 4:6]
    C[_C_FRAG] = f[:, :4]
    with np.errstate(invalid="ignore", over="ignore"):
        D = (C + A @ B).astype(np.float32)
    g, c = lane // 4, lane % 4
    return D[g, 2 * c], D[g, 2 * c + 1], D[g + 8, 2 * c], D[g + 8, 2 * c + 1]


def _fragment_tables():
    """Index tables of the warp models: where each lane's fragment registers sit in A, B and C
    (PTX ISA fragment layouts; g = lane // 4, c = lane % 4), as numpy fancy indices, so a model
    scatters a whole warp's fragments in one assignment."""
    g = (np.arange(32) // 4)[:, None, None]
    c = (np.arange(32) % 4)[:, None, None]
    r = np.arange(4)[None, :, None]
    j = np.arange(2)[None, None, :]
    # m16n8k16 .f16: a_r = A[g + 8 (r % 2), 2c + 8 (r // 2) + j]; b_r = B[2c + 8 r + j, g]
    f16_a = (np.broadcast_to(g + 8 * (r % 2), (32, 4, 2)), np.broadcast_to(2 * c + 8 * (r // 2) + j, (32, 4, 2)))
    rb = np.arange(2)[None, :, None]
    f16_b = (np.broadcast_to(2 * c + 8 * rb + j, (32, 2, 2)), np.broadcast_to(g, (32, 2, 2)))
    # the C / D fragment of both shapes: c_r = C[g + 8 (r // 2), 2c + r % 2]
    g2, c2, r2 = g[:, :, 0], c[:, :, 0], np.arange(4)[None, :]
    c_frag = (np.broadcast_to(g2 + 8 * (r2 // 2), (32, 4)), np.broadcast_to(2 * c2 + r2 % 2, (32, 4)))
    # m16n8k8 .tf32: a_r = A[g + 8 (r % 2), c + 4 (r // 2)]; b_r = B[c + 4 r, g]
    tf32_a = (np.broadcast_to(g2 + 8 * (r2 % 2), (32, 4)), np.broadcast_to(c2 + 4 * (r2 // 2), (32, 4)))
    r3 = np.arange(2)[None, :]
    tf32_b = (np.broadcast_to(c2 + 4 * r3, (32, 2)), np.broadcast_to(g2, (32, 2)))
    return f16_a, f16_b, c_frag, tf32_a, tf32_b


_F16_A, _F16_B, _C_FRAG, _TF32_A, _TF32_B = _fragment_tables()


def tf32_round_host(x) -> np.ndarray:
    """float32 array rounded to TensorFloat-32 like PTX ``cvt.rna.tf32.f32``: to nearest, ties away
    from zero, the low 13 mantissa bits cleared (an overflow past the largest value gives inf; NaN
    stays NaN). Used by the host weight image and the simulator."""
    bits = np.asarray(x, dtype=np.float32).view(np.uint32)
    finite = (bits & np.uint32(0x7F800000)) != np.uint32(0x7F800000)
    rounded = ((bits.astype(np.uint64) + 0x1000) & TF32_MASK).astype(np.uint32)
    return np.where(finite, rounded, bits).view(np.float32)


def mma_tf32_warp(frags, lane):
    """Simulator model of one warp's ``mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32``:
    ``frags[32, 10]`` holds every lane's (a0..a3, b0, b1, c0..c3); returns lane ``lane``'s
    (d0..d3) as float32. Operands are truncated to tf32 (the low 13 mantissa bits dropped: the
    kernels pass values already rounded by ``tf32_round``), the products summed in float64 and
    rounded once to fp32 (the hardware's fp32 accumulation may round differently). Fragment layout (PTX ISA, "Matrix
    Fragments for mma.m16n8k8", .tf32; g = lane // 4, c = lane % 4): a0 = A[g, c], a1 = A[g+8, c],
    a2 = A[g, c+4], a3 = A[g+8, c+4]; b0 = B[c, g], b1 = B[c+4, g]; c0, c1 = C[g, 2c], C[g, 2c+1];
    c2, c3 = C[g+8, 2c], C[g+8, 2c+1]."""
    f = np.asarray(frags, dtype=np.float32)
    t = (f.view(np.uint32) & np.uint32(TF32_MASK)).view(np.float32).astype(np.float64)
    A = np.zeros((16, 8))
    B = np.zeros((8, 8))
    C = np.zeros((16, 8))
    A[_TF32_A] = t[:, 0:4]
    B[_TF32_B] = t[:, 4:6]
    C[_C_FRAG] = f[:, 6:10]
    with np.errstate(invalid="ignore", over="ignore"):
        D = (C + A @ B).astype(np.float32)
    g, c = lane // 4, lane % 4
    return D[g, 2 * c], D[g, 2 * c + 1], D[g + 8, 2 * c], D[g + 8, 2 * c + 1]


DECODE = {"fp32": decode_fp32, "fp16": decode_fp16, "bf16": decode_bf16, "int8": decode_int8}
#: elements per 8-byte word
PER_WORD = {"fp32": 2, "fp16": 4, "bf16": 4, "int8": 8}
