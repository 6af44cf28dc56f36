"""Every Triton kernel compiles for Hopper (sm_90) with triton's bundled ptxas, no GPU needed.

The interpreter (which runs the other kernel tests on CPU) does not run the compiler, so this
catches what only a real compile rejects: globals in jit code, dot shapes, types, inline PTX.
It covers the shared tile-logits helper through the decode kernel (`tile_logits`, every flag of
it set both ways somewhere), the fused dK/dV and dQ kernels (`tile_logits_and_derivatives`, their
MUFU paths), and the forward's own paths (bands, the column-term series, TMA tiles). The shipped
configs' kernels, compiled as launched, are lab/kernels/kernel_fingerprint.py's.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

COMPILE_SCRIPT = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from tapa.ops.tapa import decode_kernel, kernels

FP32_POINTERS = {"Lse", "Delta", "DLse", "LSE", "PART", "PART_LSE"}
INT_POINTERS = {"SEQLENS", "STARTS"}
FLOATS = {"amp_scale", "logit_scale", "phase_scale", "alpha", "taylor_rho", "b1", "b2", "b3", "b4", "b5",
          "b6", "rho_in", "rho_out", "amp_grad_scale", "phase_grad_scale"}


def compile_for_gpu(kernel, constexprs, dtype, num_warps, num_stages=2, out_dtype=None,
                    descriptors=None, arch=90):
    # descriptors: {name: 'tensordesc<...>'} of a TMA kernel's descriptor arguments; a kernel
    # with such arguments and without TMA takes them as None
    signature = dict(descriptors or {})
    if "VARLEN" in kernel.arg_names and "VARLEN" not in constexprs:  # dense: no sequence offsets
        constexprs.update(VARLEN=False, CuQ=None, CuK=None)
    for name in kernel.arg_names:
        if name in signature:
            continue
        if "Desc" in name and not constexprs.get("TMA"):
            constexprs[name] = None
        if name in constexprs:
            signature[name] = "constexpr"
        elif name == "OUT":  # the decode kernel's output: final (q's dtype) or float32 partials
            signature[name] = "*" + (out_dtype or dtype)
        elif name in FP32_POINTERS or (name == "DQ" and constexprs.get("DQ_ATOMIC")):
            signature[name] = "*fp32"
        elif name in INT_POINTERS:
            signature[name] = "*i32"
        elif name[0].isupper():
            signature[name] = "*" + dtype
        else:
            signature[name] = "fp32" if name in FLOATS else "i32"
    source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs)
    return triton.compile(source, target=GPUTarget("cuda", arch, 32),
                          options={"num_warps": num_warps, "num_stages": num_stages})


def logit_flags(dtype, power, quadratic, trig_poly, long_phase, taylor_order=6):
    return dict(DIST_POWER=power, PHASE_QUAD=quadratic, TRIG_POLY=trig_poly, TAYLOR_ORDER=taylor_order,
                PTX_ASM=True, LONG_PHASE=long_phase, DOT_PRECISION="ieee" if dtype == "fp32" else "tf32")


decode_variants = [  # dtype, final, power, quadratic, trig poly, long phase, starts, BLOCK_N, warps, stages,
    # taylor order
    ("bf16", False, True, True, True, False, True, 64, 4, 2, 6),
    ("bf16", True, False, False, False, True, False, 128, 8, 3, 6),
    ("fp16", False, True, False, True, True, True, 32, 4, 3, 2),
    ("fp32", True, True, True, False, False, False, 64, 4, 2, 4),
]
for (dtype, final, power, quadratic, trig_poly, long_phase, starts, block_n, warps, stages,
     order) in decode_variants:
    flags = logit_flags(dtype, power, quadratic, trig_poly, long_phase, order)
    constexprs = dict(HAS_STARTS=starts, FINAL=final, **flags,
                      BLOCK_M=16, BLOCK_N=block_n, BLOCK_D=128, BLOCK_DV=128)
    compile_for_gpu(decode_kernel._split_kernel, constexprs, dtype, warps, stages,
                    out_dtype=dtype if final else "fp32")
compile_for_gpu(decode_kernel._merge_kernel, dict(BLOCK_S=128, BLOCK_DV=128), "bf16", 8)

fused = dict(AMP_DIM=32, HEAD_DIM=64, V_DIM=64, BLOCK_DA=32, BLOCK_DP=32, BLOCK_DV=64, CAUSAL=True)
compile_for_gpu(kernels._bwd_dkdv_kernel,
                dict(fused, **logit_flags("bf16", True, False, True, False, 3), BLOCK_M=32, BLOCK_N=128,
                     DQ_ATOMIC=True, DQ_TRANSPOSE=False, COS_RADIANS=False, FAST_SCALARS=False),
                "bf16", 8, 2)
compile_for_gpu(kernels._bwd_dkdv_kernel,  # dQ^T = K^T dS (wgmma with M = the columns)
                dict(fused, **logit_flags("bf16", True, True, False, False), BLOCK_M=32, BLOCK_N=128,
                     DQ_ATOMIC=True, DQ_TRANSPOSE=True, COS_RADIANS=True, FAST_SCALARS=True),
                "bf16", 8, 2)
compile_for_gpu(kernels._bwd_dq_kernel,  # the dQ kernel's MUFU paths (PTX, GPU only)
                dict(fused, **logit_flags("bf16", True, True, False, False, 2), BLOCK_M=64, BLOCK_N=32,
                     SPLIT_S=1, COS_RADIANS=True, FAST_SCALARS=True), "bf16", 4, 2)
compile_for_gpu(kernels._fwd_kernel,  # the forward's bands, column-term series and TMA tiles
                dict(fused, **logit_flags("bf16", True, True, False, False, 2), BLOCK_M=64, BLOCK_N=64,
                     SPLIT_S=2, FAST_SCALARS=True, COS_RADIANS=True, TMA=True, BANDS=True),
                "bf16", 4, 2, descriptors=dict(KDescA="tensordesc<bf16[1,64,1,32]>",
                                               KDescP="tensordesc<bf16[1,64,1,32]>",
                                               VDesc="tensordesc<bf16[1,64,1,64]>"))
print("compiled for sm_90")
"""


def _ptxas_available() -> bool:
    spec = importlib.util.find_spec("triton")
    return spec is not None and (Path(spec.origin).parent / "backends" / "nvidia" / "bin" / "ptxas").is_file()


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available() or not _ptxas_available(),
                    reason="CPU-only check with triton's bundled ptxas")
def test_kernels_compile_for_gpu():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-c", COMPILE_SCRIPT], capture_output=True, text=True,
                            env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "compiled for sm_90" in result.stdout


# The widest decode tiles against an A100's shared memory (163 KB a block): at head dim 256 each
# dtype needs one tile of DECODE's that fits.
DECODE_SHARED_SCRIPT = COMPILE_SCRIPT.split("decode_variants = [")[0] + """
from tapa.ops.tapa.configs import DECODE
for dtype in ("fp16", "bf16", "fp32"):
    flags = logit_flags(dtype, True, True, True, False)
    shared = {}
    for block_n, warps in DECODE.tiles:
        constexprs = dict(HAS_STARTS=False, FINAL=False, **flags, BLOCK_M=16, BLOCK_N=block_n, BLOCK_D=256,
                          BLOCK_DV=256)
        compiled = compile_for_gpu(decode_kernel._split_kernel, constexprs, dtype, warps, DECODE.num_stages,
                                   out_dtype="fp32", arch=80)
        shared[f"{block_n}x{warps}"] = compiled.metadata.shared
    print(dtype, min(shared.values()), shared)
"""


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available() or not _ptxas_available(),
                    reason="CPU-only check with triton's bundled ptxas")
def test_every_decode_dtype_has_a_tile_that_fits_an_a100_at_head_dim_256():
    """The autotuner drops a tile that does not fit the GPU's shared memory; if none fits, the call
    fails. Float32 at head dim 256 needs the 32-key tile on an A100 (64 keys: 168,000 bytes)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-c", DECODE_SHARED_SCRIPT], capture_output=True, text=True,
                            env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    smallest = {line.split()[0]: int(line.split()[1]) for line in result.stdout.splitlines()[-3:]}
    assert set(smallest) == {"fp16", "bf16", "fp32"}, result.stdout
    a100_max = 163 * 1024  # bytes of shared memory one block may use on an A100 (sm_80)
    assert all(size <= a100_max for size in smallest.values()), result.stdout


LONG_PHASE_SCRIPT = """
import sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from tapa.ops.tapa import kernels

kernel = kernels._fwd_kernel
constexprs = dict(AMP_DIM=16, HEAD_DIM=32, V_DIM=32, BLOCK_DA=16, BLOCK_DP=16, BLOCK_DV=32, BLOCK_M=64,
                  BLOCK_N=32, CAUSAL=True, DIST_POWER=False, PHASE_QUAD=True, TRIG_POLY=True,
                  TAYLOR_ORDER=6, PTX_ASM=True, LONG_PHASE=sys.argv[1] == "1", DOT_PRECISION="ieee",
                  SPLIT_S=0, FAST_SCALARS=False, COS_RADIANS=False, TMA=False, BANDS=False,
                  KDescA=None, KDescP=None, VDesc=None)
if "VARLEN" in kernel.arg_names:  # dense: no sequence offsets
    constexprs.update(VARLEN=False, CuQ=None, CuK=None)
signature = {name: "constexpr" if name in constexprs else "*fp32" if name[0].isupper()
             else "i32" if name.startswith(("stride", "n_", "q_off", "k_off", "heads", "group")) else "fp32"
             for name in kernel.arg_names}
compiled = triton.compile(ASTSource(fn=kernel, signature=signature, constexprs=constexprs),
                          target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "num_stages": 2})
print(compiled.asm["ptx"])
"""


@pytest.mark.skipif(torch.cuda.is_available() or not _ptxas_available(),
                    reason="CPU-only check with triton's bundled ptxas")
def test_long_phase_reduction_reads_the_rounded_phase():
    """With LONG_PHASE the turn reduction must see t = fl(phi * fs): FP fusion would otherwise fuse
    phi * fs into the reduction's `+ 1.5 * 2**23` (an fma on the magic constant), which left
    |r| > 1/2 and NaN out of the polynomials on the H200 (linear distance, alpha = 2**72). The
    short-phase path keeps the fusion (harmless below 2**22): the pattern is there to be found."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    fused_magic = re.compile(r"fma\.rn\.f32\s+%r\d+, %r\d+, %r\d+, 0f4B400000;")
    ptx = {}
    for long_phase in ("0", "1"):
        result = subprocess.run([sys.executable, "-c", LONG_PHASE_SCRIPT, long_phase], capture_output=True,
                                text=True, env=env, timeout=300)
        assert result.returncode == 0, result.stderr[-4000:]
        ptx[long_phase] = result.stdout
    assert fused_magic.search(ptx["0"])
    assert not fused_magic.search(ptx["1"])
    assert "mul.rn.f32" in ptx["1"]
