"""Compile every kernel variant to PTX for a real GPU target, without a GPU.

The CUDA simulator runs kernels as Python and type-checks nothing; this compiles each variant with
NVVM for ``sm_90`` (H100 / H200), so typing and lowering errors show up in CI, and reports what the
PTX says about each variant (local-memory traffic, global load widths). Needs the NVVM and NVRTC
wheels (``nvidia-nvvm``, ``nvidia-cuda-nvrtc``; in the test extras) and must run in a process where
the simulator is off: ``NUMBA_ENABLE_CUDASIM=0 python -m andromeda_nb.ptxcheck``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys


def _fake_device(cc):
    """Device functions compile for the current device; give them one without a driver."""
    import numba.cuda.dispatcher as dispatcher

    class _Device:
        compute_capability = cc

    dispatcher.get_current_device = lambda: _Device()


def variants():
    """(name, dispatcher, signature) for every kernel variant the host wrappers can launch."""
    from numba import types as nt

    from .kernels import match as M
    from .kernels import score as S
    from .kernels import topk as T

    f32, i32, i64, u64 = nt.float32, nt.int32, nt.int64, nt.uint64

    def A(t, nd=1):
        return nt.Array(t, nd, "C")

    store = {"fp32": f32, "fp16": nt.float16, "bf16": nt.uint16, "int8": nt.int8}
    out = []
    for dtype, st in store.items():
        for layout in S.LAYOUTS:
            for access in S.ACCESS:
                for topk in (0, 2048):
                    for d, E, K in ((64, 6, 2), (32, 1, 1), (128, 8, 8)):
                        if (d, E, K) != (64, 6, 2) and (access != "pool" or topk):
                            continue
                        k = S.gated_score_kernel(d, E, K, dtype, layout, access, 256, topk, topk > 0)
                        tab = A(st, 2 if layout == "rows" else 3)
                        sig = (tab, A(f32), A(f32), A(f32), A(f32), A(f32), A(f32), A(u64), A(i32), i64,
                               A(i64), i64, A(f32), A(f32), A(i32), A(i64))
                        out.append((f"gated d{d} E{E} K{K} {dtype} {layout} {access} topk{topk}", k, sig))
    for cap in (512, 2048, 4096):
        for elig in (False, True):
            for ids in (False, True):
                out.append((f"topk_scores cap{cap} elig{elig} ids{ids}", T.topk_scores_kernel(cap, 256, elig, ids),
                            (A(f32), A(u64), A(i64), i64, i64, A(f32), A(i32), A(i64))))
        out.append((f"merge cap{cap}", T.merge_kernel(cap, 256, True),
                    (A(f32), A(i32), i64, i64, i64, A(i64), A(f32), A(i32), A(i64), i64)))
    out.append(("match", M.match_kernel(256), (A(u64, 2), A(i32), A(i32), A(i32), A(i32), A(u64), A(i64))))
    out.append(("clear_bits", M.clear_bits_kernel(), (A(u64), A(i64), A(i64))))
    return out


def inspect_ptx(ptx: str) -> dict:
    """Counts read off PTX text: local-memory ops and global loads by width."""
    loads = re.findall(r"ld\.global(?:\.\w+)*?\.(v[24]\.)?([busf]\d+)", ptx)
    widths = {}
    for vec, ty in loads:
        nbytes = int(ty[1:]) // 8 * (int(vec[1]) if vec else 1)
        widths[nbytes] = widths.get(nbytes, 0) + 1
    return {
        "local_ops": len(re.findall(r"\b(?:ld|st)\.local", ptx)),
        "global_load_bytes": dict(sorted(widths.items())),
        "lines": ptx.count("\n"),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cc", default="9.0", help="compute capability to compile for (default 9.0)")
    ap.add_argument("--only", default=None, help="regex on variant names")
    ap.add_argument("--json", action="store_true", help="print one JSON object per variant")
    args = ap.parse_args(argv)
    if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0"):
        print("ptxcheck needs NUMBA_ENABLE_CUDASIM=0 (it compiles for a real GPU)", file=sys.stderr)
        return 2
    os.environ["NUMBA_ENABLE_CUDASIM"] = "0"
    from numba import cuda

    from . import backend

    backend._chosen = "cuda"  # compile only: nothing here launches
    cc = tuple(int(x) for x in args.cc.split("."))
    _fake_device(cc)
    failures = 0
    for name, disp, sig in variants():
        if args.only and not re.search(args.only, name):
            continue
        try:
            ptx, _ = cuda.compile_ptx(disp.py_func, sig, cc=cc)
        except Exception as exc:  # report every failing variant, then fail
            failures += 1
            print(f"FAIL {name}: {type(exc).__name__}: {str(exc).splitlines()[0]}")
            continue
        info = inspect_ptx(ptx)
        if args.json:
            print(json.dumps({"variant": name, **info}))
        else:
            flag = "" if info["local_ops"] == 0 else "  <-- local memory"
            print(f"ok   {name}: local ops {info['local_ops']}, global loads {info['global_load_bytes']}{flag}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
