"""Device intrinsics that move memory: a 4-byte half of an 8-byte word loaded alone
(:func:`ld_half`), 8-byte loads at a byte offset (:func:`ld_u64`), L2 prefetches, and
the asynchronous global-to-shared copies of the int8 rows' ring (:func:`cp_async_row`: a round's
row and scale an ad, :func:`cp_async_commit` and :func:`cp_async_wait`, and :func:`shared_offset`,
the 32-bit shared address they start from).

The simulator gets numpy versions with the same results (it runs kernels as Python; its copies
land at once).
"""

import numpy as np
from numba.cuda.core import config

#: bytes of one row of a warp's 32 ring words (cp_async_row: a slot's word rows are this far apart)
ROW_BYTES = 32 * 8

if config.ENABLE_CUDASIM:
    def ld_half(words, i, j, half):
        return np.uint32((int(words[int(i), int(j)]) >> (32 * int(half))) & 0xFFFFFFFF)

    def ld_u64(words, off):
        off, size = int(off), words.size * words.itemsize
        if off < 0 or off % 8 or off + 8 > size:
            raise IndexError(f"byte offset {off} outside the array's {size} bytes or off 8-byte alignment")
        return np.uint64(np.asarray(words).reshape(-1).view(np.uint64)[off // 8])

    def _check_prefetch(arr, idx):
        # no cache to warm; the index is checked as the device needs it (in range, non-negative)
        if min(idx) < 0 or any(x >= n for x, n in zip(idx, arr.shape)):
            raise IndexError(f"prefetch index {idx} outside {arr.shape}")

    def prefetch_l2(arr, i):
        _check_prefetch(arr, (int(i),))

    def prefetch_l2_2d(arr, i, j):
        _check_prefetch(arr, (int(i), int(j)))

    def shared_offset(arr, i, j):
        # a byte offset from the array's start stands for the shared-window address (cp_async_row
        # takes the array too, and adds the offset to it)
        return (int(i) * arr.shape[1] + int(j)) * arr.itemsize

    def cp_async_row(ring, b0, b1, b2, b3, words, a, src_bytes, nw, per, tiles, scales, at_scale, scale):
        flat = ring.reshape(-1)
        for w in range(nw):
            at = ((b0, b1, b2, b3)[w // per] + (w % per) * ROW_BYTES) // 8
            flat[at] = (words[w, int(a)] if tiles else words[int(a), w]) if src_bytes else 0
        scales.reshape(-1)[at_scale // scales.itemsize] = scale[int(a)] if src_bytes else 0

    def cp_async_commit():
        pass

    def cp_async_wait(n):
        pass

else:
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    _I64 = ir.IntType(64)

    @intrinsic
    def ld_half(typingctx, words, i, j, half):
        """Half ``half`` (0: the low 32 bits) of ``words[i, j]`` (a 2-D uint64 array, indices in
        range and non-negative) as one 4-byte load: a lane that needs 4 bytes of an 8-byte word
        holds one register, not two."""
        if not (isinstance(words, types.Array) and words.dtype == types.uint64 and words.ndim == 2
                and all(isinstance(x, types.Integer) for x in (i, j, half))):
            return None
        sig = types.uint32(words, i, j, half)

        contiguous = words.layout == "C"

        def codegen(context, builder, sig, args):
            ary = context.make_array(sig.args[0])(context, builder, value=args[0])
            ix = [builder.sext(a, _I64) if a.type.width < 64 else a for a in args[1:]]
            if contiguous:  # (i * columns + j) words: the element size a shift, as Numba indexes C arrays
                word = builder.add(builder.mul(ix[0], builder.extract_value(ary.shape, 1)), ix[1])
                row = builder.shl(word, ir.Constant(_I64, 3))
            else:
                st = [builder.extract_value(ary.strides, k) for k in range(2)]  # bytes
                row = builder.add(builder.mul(ix[0], st[0]), builder.mul(ix[1], st[1]))
            off = builder.add(row, builder.shl(ix[2], ir.Constant(_I64, 2)))
            ptr = builder.gep(builder.bitcast(ary.data, ir.PointerType(ir.IntType(8))), [off])
            return builder.load(builder.bitcast(ptr, ir.PointerType(ir.IntType(32))), align=4)

        return sig, codegen


    @intrinsic
    def ld_u64(typingctx, words, off):
        """The 8 bytes at byte offset ``off`` (in range, a multiple of 8) of a C-contiguous array's
        data: a kernel that steps its own offsets (a lane's rows of a round: one base and constant
        or loop-invariant steps) pays a 64-bit add a load, where an element index pays a
        multiply-add chain from the index each time."""
        if not (isinstance(words, types.Array) and words.layout == "C" and isinstance(off, types.Integer)):
            return None

        def codegen(context, builder, sig, args):
            ary = context.make_array(sig.args[0])(context, builder, value=args[0])
            o = args[1] if args[1].type.width == 64 else builder.zext(args[1], _I64)
            ptr = builder.gep(builder.bitcast(ary.data, ir.PointerType(ir.IntType(8))), [o])
            return builder.load(builder.bitcast(ptr, ir.PointerType(_I64)), align=8)

        return types.uint64(words, off), codegen

    def _prefetch_l2_codegen(context, builder, sig, args):
        aryty = sig.args[0]
        ary = context.make_array(aryty)(context, builder, value=args[0])
        off = ir.Constant(_I64, 0)
        for k, a in enumerate(args[1:]):
            a = builder.sext(a, _I64) if a.type.width < 64 else a
            off = builder.add(off, builder.mul(a, builder.extract_value(ary.strides, k)))
        ptr = builder.gep(builder.bitcast(ary.data, ir.PointerType(ir.IntType(8))), [off])
        fnty = ir.FunctionType(ir.VoidType(), [_I64])
        asm = ir.InlineAsm(fnty, "{ .reg .u64 g; cvta.to.global.u64 g, $0; prefetch.global.L2 [g]; }", "l",
                           side_effect=True)
        builder.call(asm, [builder.ptrtoint(ptr, _I64)])
        return context.get_dummy_value()

    @intrinsic
    def prefetch_l2(typingctx, arr, i):
        """Ask L2 for the 128-byte line holding ``arr[i]`` (a 1-D array, ``i`` in range and
        non-negative): ``prefetch.global.L2``, no register written, nothing waits for it. Lines
        asked for a few rounds ahead are in L2 when the round's own loads come, so a kernel whose
        registers bound its loads in flight keeps more DRAM requests outstanding."""
        if not (isinstance(arr, types.Array) and arr.ndim == 1 and isinstance(i, types.Integer)):
            return None
        return types.void(arr, i), _prefetch_l2_codegen

    @intrinsic
    def prefetch_l2_2d(typingctx, arr, i, j):
        """:func:`prefetch_l2` of ``arr[i, j]`` (a 2-D array)."""
        if not (isinstance(arr, types.Array) and arr.ndim == 2 and isinstance(i, types.Integer)
                and isinstance(j, types.Integer)):
            return None
        return types.void(arr, i, j), _prefetch_l2_codegen


    def _element_address(context, builder, aryty, ary, index):
        """The generic address of ``ary[index]`` (a tuple of integers, one an axis) as an i64."""
        arr = context.make_array(aryty)(context, builder, value=ary)
        off = ir.Constant(_I64, 0)
        for k in range(aryty.ndim):
            i = builder.extract_value(index, k)
            i = builder.sext(i, _I64) if i.type.width < 64 else i
            off = builder.add(off, builder.mul(i, builder.extract_value(arr.strides, k)))
        return builder.ptrtoint(builder.gep(builder.bitcast(arr.data, ir.PointerType(ir.IntType(8))), [off]), _I64)

    @intrinsic
    def shared_offset(typingctx, arr, i, j):
        """The 32-bit shared-window address of ``arr[i, j]`` (a 2-D shared array, indices in range
        and non-negative): a base that :func:`cp_async_row` offsets by constants, where a copy
        addressed by array index computes a 64-bit generic address and converts it each time."""
        if not (isinstance(arr, types.Array) and arr.ndim == 2 and isinstance(i, types.Integer)
                and isinstance(j, types.Integer)):
            return None

        def codegen(context, builder, sig, args):
            at = _element_address(context, builder, sig.args[0], args[0],
                                  context.make_tuple(builder, types.UniTuple(types.int64, 2),
                                                     [context.cast(builder, args[k], sig.args[k], types.int64)
                                                      for k in (1, 2)]))
            fnty = ir.FunctionType(ir.IntType(32), [_I64])
            return builder.call(ir.InlineAsm(fnty, "{ .reg .u64 s; cvta.to.shared.u64 s, $1; cvt.u32.u64 $0, s; }",
                                             "=r,l"), [at])

        return types.uint32(arr, i, j), codegen

    @intrinsic
    def cp_async_row(typingctx, ring, b0, b1, b2, b3, words, a, src_bytes, nw, per, tiles, scales, at_scale, scale):
        """Start the asynchronous copies of ad ``a``'s ``nw`` 8-byte words (``words[w, a]`` on
        ``tiles``, else ``words[a, w]``) and its 4-byte scale ``scale[a]`` into a ring slot: word w
        lands at shared address ``b{w // per}`` plus ``(w % per) * 256`` (a row of 32 words; the
        groups' bases hold their swizzled columns), the scale at ``at_scale`` (in ``scales``, the
        ring's scale array); ``src_bytes`` 8 or 0 (zeros written, nothing read; the scale's copy
        half of it). ``cp.async.ca.shared.global``: no register waits for the copies;
        :func:`cp_async_commit` closes a group of them, :func:`cp_async_wait` waits until at most n
        groups are pending, and they are then visible to the thread that issued them (other lanes:
        after a warp barrier).
        One block of PTX: the shared addresses are a register and an immediate, the source a 64-bit
        add a word (``tiles``) or an immediate (rows), ~2 instructions a copy where
        a copy addressed by array index took ~6. ``nw``, ``per`` and ``tiles`` are constants."""
        if not (isinstance(ring, types.Array) and isinstance(words, types.Array) and words.ndim == 2
                and words.dtype == types.uint64 and isinstance(scale, types.Array) and scale.ndim == 1
                and scale.dtype.bitwidth == 32 and isinstance(scales, types.Array)
                and all(isinstance(x, types.Integer) for x in (b0, b1, b2, b3, a, src_bytes, at_scale))
                and all(isinstance(x, types.IntegerLiteral) for x in (nw, per, tiles))):
            return None
        count, group, by_tiles = nw.literal_value, per.literal_value, bool(tiles.literal_value)
        if count > 4 * group:
            return None

        def codegen(context, builder, sig, args):
            a64 = context.cast(builder, args[6], sig.args[6], types.int64)
            zero = ir.Constant(_I64, 0)
            first = context.make_tuple(builder, types.UniTuple(types.int64, 2), [zero, a64] if by_tiles else [a64, zero])
            src = _element_address(context, builder, sig.args[5], args[5], first)
            at = _element_address(context, builder, sig.args[13], args[13], context.make_tuple(
                builder, types.UniTuple(types.int64, 1), [a64]))
            step = builder.extract_value(context.make_array(sig.args[5])(context, builder, value=args[5]).strides, 0)
            to32 = [context.cast(builder, args[k], sig.args[k], types.uint32) for k in (1, 2, 3, 4, 7, 12)]
            # operands: $0..$3 the groups' bases, $4 the source, $5 its word-row step, $6 the bytes,
            # $7 the scale's shared address, $8 its source
            lines = ["{ .reg .u64 g, h; .reg .u32 b; cvta.to.global.u64 g, $4;"]
            for w in range(count):
                dst = f"[${w // group}+{(w % group) * ROW_BYTES}]"
                if by_tiles:
                    lines.append("mov.u64 h, g;" if w == 0 else "add.s64 h, h, $5;")
                    lines.append(f"cp.async.ca.shared.global {dst}, [h], 8, $6;")
                else:
                    lines.append(f"cp.async.ca.shared.global {dst}, [g+{8 * w}], 8, $6;")
            lines.append("cvta.to.global.u64 h, $8; shr.u32 b, $6, 1; cp.async.ca.shared.global [$7], [h], 4, b; }")
            i32 = ir.IntType(32)
            fnty = ir.FunctionType(ir.VoidType(), [i32, i32, i32, i32, _I64, _I64, i32, i32, _I64])
            asm = ir.InlineAsm(fnty, " ".join(lines), "r,r,r,r,l,l,r,r,l,~{memory}", side_effect=True)
            builder.call(asm, [*to32[:4], src, step, to32[4], to32[5], at])
            return context.get_dummy_value()

        return types.void(ring, b0, b1, b2, b3, words, a, src_bytes, nw, per, tiles, scales, at_scale, scale), codegen

    @intrinsic
    def cp_async_commit(typingctx):
        """Close this thread's pending :func:`cp_async_row` copies into one group."""
        def codegen(context, builder, sig, args):
            builder.call(ir.InlineAsm(ir.FunctionType(ir.VoidType(), []), "cp.async.commit_group;", "~{memory}",
                                      side_effect=True), [])
            return context.get_dummy_value()

        return types.void(), codegen

    @intrinsic
    def cp_async_wait(typingctx, n):
        """Wait until at most ``n`` (a constant) of this thread's copy groups are pending."""
        if not isinstance(n, types.IntegerLiteral):
            return None
        pending = n.literal_value

        def codegen(context, builder, sig, args):
            builder.call(ir.InlineAsm(ir.FunctionType(ir.VoidType(), []), f"cp.async.wait_group {pending};", "~{memory}",
                                      side_effect=True), [])
            return context.get_dummy_value()

        return types.void(n), codegen
