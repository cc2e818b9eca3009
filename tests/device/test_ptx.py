"""Every kernel variant compiles for a real GPU (sm_90) with no local-memory traffic.

The simulator type-checks nothing; this compiles with NVVM in a subprocess with the simulator off.
"""

import importlib.metadata
import os
import subprocess
import sys

import pytest


def _nvvm_available() -> bool:
    try:
        importlib.metadata.version("nvidia-nvvm")
        importlib.metadata.version("nvidia-cuda-nvrtc")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


@pytest.mark.slow
@pytest.mark.skipif(not _nvvm_available(), reason="NVVM wheels not installed (pip install -e '.[test]')")
def test_all_kernels_compile_for_sm90_without_local_memory():
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "0"}
    proc = subprocess.run([sys.executable, "-m", "andromeda_nb.device.ptxcheck", "--quick"], env=env, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("ok")]
    assert len(lines) >= 10
    assert not [line for line in lines if "local memory" in line], "a kernel spills to local memory"


def test_the_main_loop_is_the_longest_backward_branch():
    """ptxcheck --sass counts the instructions between the longest backward branch and its target
    (the generated kernels' round loop), predicates and modifiers dropped; forward branches and a
    shorter inner loop do not count, and a kernel without a loop has none; every outermost loop
    is listed too, in order."""
    from andromeda_nb.device.ptxcheck import loop_opcodes, outer_loops

    sass = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   BRA `(.L_x_2) ;
.L_x_0:
.L_x_3:
        /*0020*/                   LDG.E.64 R2, desc[UR4][R4.64] ;
        /*0030*/              @!P0 HFMA2 R6, R2, R3, -RZ ;
.L_x_1:
        /*0040*/                   HMMA.16816.F32 R8, R12, R14, R8 ;
        /*0050*/             @UP0 IADD3 R4, P1, R4, 0x20, RZ ;
        /*0060*/               @P1 BRA `(.L_x_1) ;
        /*0070*/                   ISETP.GE.AND P0, PT, R4, R5, PT ;
        /*0080*/              @!P0 BRA `(.L_x_0) ;
.L_x_2:
        /*0090*/                   EXIT ;
.L_x_4:
        /*00a0*/                   BRA `(.L_x_4) ;
"""
    body = loop_opcodes(sass)
    assert sum(body.values()) == 7
    assert body == {"LDG": 1, "HFMA2": 1, "HMMA": 1, "IADD3": 1, "BRA": 2, "ISETP": 1}
    # the second of two labels on one address is a loop's target as well as the first
    assert loop_opcodes(sass.replace("@!P0 BRA `(.L_x_0)", "@!P0 BRA `(.L_x_3)")) == body
    # nvdisasm ends every kernel with a branch to itself: not a loop
    assert not loop_opcodes(sass.replace("@!P0 BRA `(.L_x_0)", "NOP").replace("@P1 BRA `(.L_x_1)", "NOP"))
    # outer_loops: every loop inside no other, in address order (the inner one is not counted apart);
    # a split loop over rounds (its short first loop, then the longer checked one) gives both
    assert outer_loops(sass) == [body]
    split = sass.replace(".L_x_2:\n", ".L_x_5:\n        /*0084*/                   IADD3 R4, R4, 0x1, RZ ;\n"
                         "        /*0088*/               @P2 BRA `(.L_x_5) ;\n.L_x_2:\n")
    assert [sum(c.values()) for c in outer_loops(split)] == [7, 2] and loop_opcodes(split) == body


def test_sass_options_are_refused_without_their_tools(monkeypatch, capsys):
    """--sass without ptxas and nvdisasm on PATH, and --maxrregcount without an assembly, are usage
    errors before anything compiles (not a silent run without the counts or the cap)."""
    from andromeda_nb.device import ptxcheck

    monkeypatch.setenv("PATH", "")
    for argv, said in ((["--sass"], "--sass needs ptxas and nvdisasm"),
                       (["--maxrregcount", "128"], "--maxrregcount is a cap for ptxas")):
        with pytest.raises(SystemExit):
            ptxcheck.main(argv)
        assert said in capsys.readouterr().err
