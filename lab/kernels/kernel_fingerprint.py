"""Fingerprints of the compiled fused and decode kernels of the shipped configs, offline (sm_90,
no GPU): the speed guard of a refactor that must not change the compiled code.

Each case (dtype, D, kernel, tile, causal, distance/phase; dense, or packed sequences under
varlen/...) is compiled with `triton.compile` for GPUTarget("cuda", 90, 32), specialized as
Triton's launcher specializes the benchmark's calls (16-byte aligned pointers, strides and lengths
multiples of 16, group = 1), with the constexprs the launch passes. Recorded per case: registers,
stack, shared memory, the SASS instruction count and three hashes: the SASS opcode sequence, the
SASS text with the kernel-parameter offsets (c[0x0][0x...]) blanked, and the PTX without debug
lines and with the parameter names blanked. A refactor that keeps the kernels' code keeps the
first two hashes and the counts; dropping an unused kernel argument shifts the parameter offsets
(blanked) and the PTX's parameter list. Also recorded, not compared: each SASS loop's instructions
and spill accesses (LDL/STL) in `loops` (the span of each backward branch, in order), and
`wgmma_waits`, the WARPGROUP.DEPBAR count (more than the dense kernel's: ptxas serialized the
wgmma, its C7515 warning).

    PYTHONPATH=src python lab/kernels/kernel_fingerprint.py --out /tmp/after.json
    PYTHONPATH=src python lab/kernels/kernel_fingerprint.py --compare lab/kernels/fingerprint-before.json /tmp/after.json
    PYTHONPATH=src python lab/kernels/kernel_fingerprint.py --match varlen/bf16/D128 --dump /tmp/sass

--compare fails on a case of BEFORE whose code differs or that AFTER lacks; cases only in AFTER
(the varlen and fp16 ones against the baselines below) are listed. --dump writes each case's PTX
and SASS to read.

fingerprint-before.json: the kernels before the config table (commit 4a7e114, whose version of this
script built the cases from the launcher of then); fingerprint-after.json: with the table (and the
varlen kernels' dense path), 0 of 66 cases with other compiled code: the forward and the decode
merge kernels identical to the PTX, the backward and decode split kernels' SASS identical but for
the parameter-bank offsets of the scalars after rho_in and rho_out, which left their signatures.
fingerprint-varlen.json: every case, the varlen and fp16 ones too, after the varlen backward's
padded lse rows (docs/kernel-log.md, the varlen section), under Triton 3.9.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

FLOAT_ARGS = {"logit_scale", "phase_scale", "alpha", "taylor_rho", "b1", "b2", "b3", "b4", "b5",
              "b6", "rho_in", "rho_out", "amp_grad_scale", "phase_grad_scale", "amp_scale"}
FLOAT32_POINTERS = {"Lse", "Delta", "DLse", "PART", "PART_LSE", "LSE"}
INT32_POINTERS = {"SEQLENS", "STARTS", "CuQ", "CuK"}
_PARAM = re.compile(r"c\[0x0\]\[0x[0-9a-f]+\]")
_SASS_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)((?:\.[A-Z0-9_]+)*)\s*([^;]*);")


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _cuobjdump(cubin: bytes, flag: str) -> str:
    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as handle:
        handle.write(cubin)
        handle.flush()
        return subprocess.run([str(tool), flag, handle.name], capture_output=True, text=True,
                              check=True, timeout=120).stdout


def fingerprint(compiled) -> dict:
    """The registers, stack, shared memory and hashes of one compiled kernel."""
    cubin = compiled.asm["cubin"]
    usage = _cuobjdump(cubin, "-res-usage")
    found = {key: re.search(rf"{key}:(\d+)", usage) for key in ("REG", "STACK")}
    sass = _cuobjdump(cubin, "-sass")
    lines = [m.groups() for m in map(_SASS_LINE.search, sass.splitlines()) if m]
    ops = "\n".join(f"{(pred or '').strip()} {op}{mods}" for _, pred, op, mods, _ in lines)
    text = "\n".join(f"{addr} {(pred or '').strip()} {op}{mods} {_PARAM.sub('c[0x0][*]', args)}"
                     for addr, pred, op, mods, args in lines)
    ptx = compiled.asm["ptx"]
    ptx = "\n".join(line for line in ptx.splitlines()
                    if not re.match(r"\s*(\.loc|\.file|//)", line))
    ptx = ptx[:ptx.find(".section")] if ".section" in ptx else ptx
    ptx = re.sub(r"\w+_param_\d+", "PARAM", ptx)
    return dict(reg=int(found["REG"].group(1)), stack=int(found["STACK"].group(1)),
                shared=compiled.metadata.shared, instructions=len(lines), sass_ops=_sha(ops),
                sass=_sha(text), ptx=_sha(ptx), loops=_loops(lines),
                wgmma_waits=sum(op == "WARPGROUP" and mods.startswith(".DEPBAR")
                                for _, _, op, mods, _ in lines))


def _loops(lines) -> list[dict]:
    """Each SASS loop (from a backward branch's target to the branch): its instructions and its
    spill accesses (LDL, STL)."""
    address = [int(addr, 16) for addr, *_ in lines]
    loops = []
    for end, (_, _, op, _, args) in zip(address, lines):
        target = re.match(r"0x([0-9a-f]+)", args.strip())
        start = int(target.group(1), 16) if target else end
        if op == "BRA" and start < end:
            body = [line for at, line in zip(address, lines) if start <= at <= end]
            loops.append(dict(instructions=len(body),
                              spills=sum(line[2] in ("LDL", "STL") for line in body)))
    return loops


def compile_case(kernel, types: dict, constexprs: dict, options: dict):
    """triton.compile of `kernel` for sm_90: types[name] for each runtime argument ('*bf16',
    'fp32', 'i32', 'tensordesc<...>'), constexprs by name; pointers and integers get the launcher's
    16-divisibility hint (not fp32 scalars, not descriptors)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature, hints = {}, {}
    for index, arg in enumerate(kernel.arg_names):
        if arg in constexprs:
            signature[arg] = "constexpr"
            continue
        signature[arg] = types[arg]
        if types[arg] != "fp32" and not types[arg].startswith("tensordesc"):
            hints[(index,)] = [["tt.divisibility", 16]]
    source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=hints)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)


def _types(kernel, constexprs: dict, dtype: str, fp32_pointers=frozenset()) -> dict:
    out = {}
    for arg in kernel.arg_names:
        if arg in constexprs:
            continue
        if arg in FLOAT32_POINTERS or arg in fp32_pointers:
            out[arg] = "*fp32"
        elif arg in INT32_POINTERS:
            out[arg] = "*i32"
        elif arg[0].isupper():
            out[arg] = f"*{dtype}"
        else:
            out[arg] = "fp32" if arg in FLOAT_ARGS else "i32"
    return out


# ---------------------------------------------------------------------------------------------
# The shipped configs' launches, by the library's own host code

DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
# (dtype, D, varlen): the dense kernels, then the packed-sequence ones (VARLEN, named varlen/...)
FUSED = [("bf16", 64, False), ("bf16", 128, False), ("bf16", 256, False), ("fp32", 64, False),
         ("fp16", 64, False), ("fp16", 128, False), ("bf16", 64, True), ("bf16", 128, True),
         ("fp16", 64, True), ("fp16", 128, True)]
ALL_VARIANTS = [("power", "quadratic"), ("linear", "linear")]


def fused_cases():
    """(name, kernel, types, constexprs, options) of every fused kernel the shipped configs launch
    for bf16 and fp16 at D=64 and D=128 (every variant), dense and varlen, and bf16 D=256, float32
    D=64 (power/quadratic, causal): forward (each tile of the key-length split), dK/dV, dQ, and the
    deterministic-mode dK/dV and dQ where dQ goes by atomics."""
    import torch

    from tapa.ops.tapa import kernels, launch
    from tapa.ops.tapa.configs import lookup

    for dtype_name, head_dim, varlen in FUSED:
        dtype = getattr(torch, DTYPES[dtype_name])
        configs = lookup("cuda", dtype, head_dim)
        main = dtype_name in ("bf16", "fp16") and head_dim <= 128
        for distance, phase in ALL_VARIANTS if main else ALL_VARIANTS[:1]:
            for causal in (True, False) if main else (True,):
                _, flags = launch.logits_args(alpha=0.1, distance=distance, phase=phase,
                                              phase_dim=head_dim // 2, dtype=dtype,
                                              max_distance=16383, trig_poly=configs.trig_poly,
                                              taylor_order=configs.taylor_order,
                                              taylor_tolerance=configs.taylor_tolerance)
                common = dict(AMP_DIM=head_dim // 2, HEAD_DIM=head_dim, V_DIM=head_dim,
                              BLOCK_DA=head_dim // 2, BLOCK_DP=head_dim // 2, BLOCK_DV=head_dim,
                              CAUSAL=causal, VARLEN=varlen, group=1, **flags)
                tag = (f"{'varlen/' if varlen else ''}{dtype_name}/D{head_dim}/{distance}-{phase}/"
                       f"{'causal' if causal else 'full'}")
                tiles = dict.fromkeys((configs.fwd, configs.fwd_long))
                for tile in tiles:
                    extra = launch.fwd_flags(configs, flags)
                    yield (f"{tag}/fwd/{tile}", kernels._fwd_kernel, tile, tile.block_n, extra,
                           common, dtype_name, False)
                for deterministic in (False, True):
                    torch.use_deterministic_algorithms(deterministic)
                    try:
                        dkdv = launch.dkdv_flags(configs, flags)
                        dq = launch.dq_flags(configs, flags)
                    finally:
                        torch.use_deterministic_algorithms(False)
                    if deterministic and not launch.dkdv_flags(configs, flags)["DQ_ATOMIC"]:
                        continue  # the same kernels as without
                    mode = "/deterministic" if deterministic else ""
                    yield (f"{tag}{mode}/dkdv/{configs.dkdv}", kernels._bwd_dkdv_kernel,
                           configs.dkdv, configs.dkdv.block_m, dkdv, common, dtype_name,
                           dkdv["DQ_ATOMIC"])
                    if not dkdv["DQ_ATOMIC"]:
                        yield (f"{tag}{mode}/dq/{configs.dq}", kernels._bwd_dq_kernel, configs.dq,
                               configs.dq.block_n, dq, common, dtype_name, False)


def compile_fused(case):
    name, kernel, tile, block_rows, extra, common, dtype_name, dq_fp32 = case
    constexprs = dict(common, BLOCK_M=tile.block_m, BLOCK_N=tile.block_n, **extra)
    if not constexprs["VARLEN"]:  # dense calls: no sequence offsets (folded away)
        constexprs.update(CuQ=None, CuK=None)
    head_dim = common["HEAD_DIM"]
    types = {}
    for arg in (a for a in kernel.arg_names if "Desc" in a):
        width = head_dim // 2 if arg.endswith(("DescA", "DescP")) else head_dim
        if extra.get("TMA"):
            types[arg] = f"tensordesc<{dtype_name}[1,{block_rows},1,{width}]>"
        else:
            constexprs[arg] = None
    types.update(_types(kernel, {**constexprs, **types}, dtype_name,
                        frozenset({"DQ"}) if dq_fp32 else frozenset()))
    return compile_case(kernel, types, constexprs, tile.launch_options())


def decode_cases():
    """The split kernel at every autotuned config (BLOCK_N x warps), final and partial, and the
    merge kernel, bf16, D=64 and D=128, power/quadratic, 4 query heads a kv head, one token."""
    import torch

    from tapa.ops.tapa import decode_kernel
    from tapa.ops.tapa.configs import DECODE

    for head_dim in (64, 128):
        _, logit_flags = decode_kernel.logits_args(
            alpha=0.1, distance="power", phase="quadratic", phase_dim=head_dim // 2,
            dtype=torch.bfloat16, max_distance=32767, trig_poly=DECODE.trig_poly,
            taylor_order=DECODE.taylor_order, taylor_tolerance=DECODE.taylor_tolerance)
        for config in decode_kernel._TUNED_CONFIGS:
            for final in (True, False):
                constexprs = dict(HAS_STARTS=False, FINAL=final, **logit_flags, BLOCK_M=16,
                                  BLOCK_D=head_dim, BLOCK_DV=head_dim, **config.kwargs,
                                  stride_qd=1, stride_kd=1, stride_vd=1, stride_od=1, q_len=1)
                yield (f"decode/bf16/D{head_dim}/split/{'final' if final else 'partial'}/"
                       f"{config.kwargs['BLOCK_N']}/{config.num_warps}",
                       decode_kernel._split_kernel, constexprs,
                       dict(num_warps=config.num_warps, num_stages=config.num_stages),
                       frozenset() if final else frozenset({"OUT"}))
        for splits, warps in ((16, 4), (64, 8)):
            constexprs = dict(BLOCK_S=splits, BLOCK_DV=head_dim, stride_pd=1, stride_od=1, q_len=1)
            yield (f"decode/bf16/D{head_dim}/merge/{splits}/{warps}", decode_kernel._merge_kernel,
                   constexprs, dict(num_warps=warps), frozenset())


def compile_decode(case):
    _, kernel, constexprs, options, fp32 = case
    return compile_case(kernel, _types(kernel, constexprs, "bf16", fp32), constexprs, options)


def _dump(compiled, name: str, folder: Path) -> None:
    """The case's PTX and SASS as folder/<name with / as _>.ptx and .sass, to read by hand."""
    stem = folder / name.replace("/", "_")
    stem.with_suffix(".ptx").write_text(compiled.asm["ptx"])
    stem.with_suffix(".sass").write_text(_cuobjdump(compiled.asm["cubin"], "-sass"))


def collect(match: str | None = None, dump: Path | None = None) -> dict:
    results = {}
    jobs = [(case[0], compile_fused, case) for case in fused_cases()]
    jobs += [(case[0], compile_decode, case) for case in decode_cases()]
    for name, build, case in jobs:
        if match and match not in name:
            continue
        try:
            compiled = build(case)
            results[name] = fingerprint(compiled)
            if dump:
                _dump(compiled, name, dump)
        except Exception as err:  # noqa: BLE001  (recorded: a compile error is a finding)
            results[name] = dict(error=str(err).splitlines()[0][:200] if str(err) else type(err).__name__)
        print(name, results[name], flush=True)
    return results


def compare(before: dict, after: dict) -> int:
    """Print each case whose fingerprint differs; 1 when a code hash or a count differs or a case
    of before is missing. Cases only in after (an older baseline without them) are listed, not
    counted."""
    code = ("reg", "stack", "shared", "instructions", "sass_ops", "sass")
    bad = 0
    for name in sorted(set(before) | set(after)):
        a, b = before.get(name), after.get(name)
        if b is None:
            print(f"only before: {name}")
            bad += 1
            continue
        if a is None:
            print(f"only after: {name}")
            continue
        diff = [key for key in (*code, "ptx", "error") if a.get(key) != b.get(key)]
        if any(key in code or key == "error" for key in diff):
            print(f"DIFFERS {name}: " + ", ".join(f"{k} {a.get(k)} -> {b.get(k)}" for k in diff))
            bad += 1
        elif diff:
            print(f"same SASS, PTX text differs: {name}")
    same = len(set(before) & set(after))
    print(f"{same} cases in both, {bad} with different compiled code or missing, "
          f"{len(set(after) - set(before))} only after")
    return 1 if bad else 0


def main(argv=None) -> int:
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise SystemExit("kernel_fingerprint: compiles for sm_90; unset TRITON_INTERPRET")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--match", default=None, help="only cases whose name contains this")
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    parser.add_argument("--dump", type=Path, metavar="DIR",
                        help="also write each case's PTX and SASS into DIR")
    args = parser.parse_args(argv)
    if args.compare:
        return compare(*(json.loads(p.read_text()) for p in args.compare))
    if args.dump:
        args.dump.mkdir(parents=True, exist_ok=True)
    results = collect(args.match, args.dump)
    if args.out:
        args.out.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
