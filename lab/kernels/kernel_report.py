"""Compiler evidence for the fused kernels: registers, spills, shared memory and an opcode census
of each compiled kernel that ran in this process (`tapa.ops.tapa.launch.compiled_kernels`), or of
configs compiled offline for sm_90 (`offline_rows`, no GPU).

The census reads the SASS (cuobjdump on the cubin Triton built; Triton ships one) and counts the
instructions that decide the speed of these kernels: tensor-core ops (HGMMA is Hopper's wgmma,
HMMA the older mma.sync), MUFU (exp2, log2, cos), the FMA-pipe float ops, local-memory traffic
(LDL/STL: spills), shared and global memory ops and float32 atomics (REDG). Counts are static (each
instruction once, wherever it sits), so they compare variants of one kernel, not run time.
Without cuobjdump the same census runs on the PTX.

    PYTHONPATH=src python3 -m lab.kernels.kernel_report --head-dim 64 [LABEL:]SPEC ...
"""

from __future__ import annotations

import collections
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from tapa._paths import write_csv
from tapa.bench.attention import first_line

CENSUS = ("HGMMA", "HMMA", "MUFU", "FFMA", "FMUL", "FADD", "FMNMX", "FSEL", "FSETP", "F2F", "F2FP",
          "I2F", "I2FP", "F2I", "LDL", "STL", "LDS", "STS", "LDSM", "STSM", "LDG", "STG", "LDGSTS",
          "UTMALDG", "REDG", "RED", "ATOMG", "ATOM", "BAR", "SHFL", "WARPGROUP")
PTX_CENSUS = ("wgmma", "mma", "ex2", "lg2", "cos", "sin", "fma", "mul", "add", "sub", "max", "ld",
              "st", "red", "atom", "bar", "shfl", "cvt")
# one SASS instruction line: /*address*/, predicate, opcode, .modifiers, operands
# ("/*0a80*/   @!P0 FFMA.FTZ R3, R2, R5, R3 ;" -> 0a80, @!P0, FFMA, .FTZ, "R3, R2, R5, R3")
_SASS_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)((?:\.[A-Z0-9_]+)*)\s*([^;]*);")
_PTX_LINE = re.compile(r"^\s*(?:@!?%p\d+\s+)?([a-z][a-z0-9_]*)[.\s]")


def find_cuobjdump() -> str | None:
    """Triton's bundled cuobjdump, else one on PATH."""
    try:
        import triton

        bundled = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
        if bundled.is_file():
            return str(bundled)
    except ImportError:
        pass
    return shutil.which("cuobjdump")


def _cuobjdump(cubin: bytes, cuobjdump: str, flag: str) -> str:
    """cuobjdump's output (-sass, -res-usage) for a cubin."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as handle:
        handle.write(cubin)
        handle.flush()
        return subprocess.run([cuobjdump, flag, handle.name], capture_output=True, text=True,
                              check=True, timeout=120).stdout


def sass_of(cubin: bytes, cuobjdump: str) -> str:
    return _cuobjdump(cubin, cuobjdump, "-sass")


def sass_instructions(sass: str) -> list[dict]:
    """(addr, pred, op, mods, args) of each instruction line of a cuobjdump -sass text."""
    out = []
    for match in filter(None, map(_SASS_LINE.search, sass.splitlines())):
        addr, pred, op, mods, args = match.groups()
        out.append(dict(addr=int(addr, 16), pred=(pred or "").strip(), op=op, mods=mods, args=args.strip()))
    return out


def sass_opcodes(sass: str) -> collections.Counter:
    """Opcode (without modifiers) -> count, over the instruction lines of a cuobjdump -sass text."""
    return collections.Counter(i["op"] for i in sass_instructions(sass))


def ptx_opcodes(ptx: str) -> collections.Counter:
    """Opcode (first part, e.g. 'fma' of fma.rn.f32) -> count over a PTX text's instructions."""
    counts = collections.Counter()
    for line in ptx.splitlines():
        match = _PTX_LINE.match(line)
        if match and not line.lstrip().startswith("//"):
            counts[match.group(1)] += 1
    return counts


_census_cache: dict[int, tuple] = {}  # id(compiled kernel) -> (kind, counts, text)


def _census(compiled, cuobjdump) -> tuple[str, collections.Counter, str | None, str | None]:
    """(kind, counts, text, error) of one compiled kernel, disassembled once per process."""
    if id(compiled) in _census_cache:
        return _census_cache[id(compiled)]
    asm = getattr(compiled, "asm", {}) or {}
    result = ("none", collections.Counter(), None, None)
    if cuobjdump and "cubin" in asm:
        try:
            text = sass_of(asm["cubin"], cuobjdump)
            result = ("sass", sass_opcodes(text), text, None)
        except (OSError, subprocess.SubprocessError) as err:
            result = ("none", collections.Counter(), None, first_line(err))
    if result[2] is None and "ptx" in asm:
        result = ("ptx", ptx_opcodes(asm["ptx"]), asm["ptx"], result[3])
    _census_cache[id(compiled)] = result
    return result


def kernel_rows(dump_dir: Path | None = None, dump_kernels: frozenset = frozenset()) -> list[dict]:
    """One row per compiled kernel: its description, n_regs/n_spills/shared and the census.

    The SASS (or PTX) of the first kernel seen of each name in dump_kernels goes to dump_dir.
    """
    from tapa.ops.tapa import launch

    cuobjdump = find_cuobjdump()
    rows, dumped = [], set()
    for description, compiled in launch.compiled_kernels():
        row = dict(description)
        kind, counts, text, error = _census(compiled, cuobjdump)
        if error:
            row["census_error"] = error
        row["census"] = kind
        if text is not None:
            row["instructions"] = sum(counts.values())
            row.update({name: counts.get(name, 0) for name in (CENSUS if kind == "sass" else PTX_CENSUS)})
            name = description["kernel"]
            if dump_dir is not None and name in dump_kernels and name not in dumped:
                dump_dir.mkdir(parents=True, exist_ok=True)
                (dump_dir / f"{name}.{kind}").write_text(text)
                dumped.add(name)
        rows.append(row)
    return rows


def markdown(rows: list[dict]) -> str:
    """A short table: kernel, config, flags that differ between rows, registers, spills, census."""
    if not rows:
        return ""
    fixed = ("kernel", "config", "n_regs", "n_spills", "shared", "instructions")
    flags = [key for key in ("TRIG_POLY", "TAYLOR_ORDER", "LONG_PHASE", "HEAD_DIM")
             if len({str(r.get(key)) for r in rows}) > 1]
    census = [name for name in (*CENSUS, *PTX_CENSUS) if any(r.get(name) for r in rows)]
    columns = [*fixed[:2], *flags, *fixed[2:], *census]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in sorted(rows, key=lambda r: (r["kernel"], r["config"])):
        lines.append("| " + " | ".join(str(row.get(c, "")) for c in columns) + " |")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# Offline: compile for sm_90 on a machine without a GPU (triton's bundled ptxas)

def _resource_usage(cubin: bytes, cuobjdump: str) -> dict:
    text = _cuobjdump(cubin, cuobjdump, "-res-usage")
    found = {key: re.search(rf"{key}:(\d+)", text) for key in ("REG", "STACK")}
    return {key.lower(): int(match.group(1)) if match else None for key, match in found.items()}


def offline_rows(variants: dict, head_dim: int = 128, max_distance: int = 16383,
                 keep_sass: bool = False) -> list[dict]:
    """Compile the fwd, dK/dV and dQ kernels of each configs ({label: KernelConfigs}) for sm_90
    without a GPU (bf16, causal, theta 0.5, power/quadratic) and census them: registers and stack
    from cuobjdump -res-usage.

    The compile is specialized as Triton's launcher specializes the benchmark's calls: every
    pointer 16-byte aligned, every integer argument a multiple of 16 (strides, lengths, heads,
    offsets 0) except `group` = 1, a constant. Without these hints the loads are not vectorized
    and the loops not pipelined (no cp.async), which would misstate the kernels. A GPU run's
    `attention_kernels.csv` has the kernels actually launched. keep_sass: each row also holds its
    kernel's SASS text ("sass")."""
    import torch

    from lab.kernels.kernel_fingerprint import compile_fused
    from tapa.ops.tapa import kernels, launch

    cuobjdump = find_cuobjdump()
    rows = []
    for label, configs in variants.items():
        _, flags = launch.logits_args(alpha=0.1, distance="power", phase="quadratic",
                                      phase_dim=head_dim // 2, dtype=torch.bfloat16,
                                      max_distance=max_distance, trig_poly=configs.trig_poly,
                                      taylor_order=configs.taylor_order,
                                      taylor_tolerance=configs.taylor_tolerance)
        dkdv = launch.dkdv_flags(configs, flags)
        dq_atomic = dkdv["DQ_ATOMIC"]
        common = dict(AMP_DIM=head_dim // 2, HEAD_DIM=head_dim, V_DIM=head_dim, BLOCK_DA=head_dim // 2,
                      BLOCK_DP=head_dim // 2, BLOCK_DV=head_dim, CAUSAL=True, VARLEN=False, group=1,
                      **flags)
        # (name, kernel, tile, extra constexprs, dQ in float32): the fingerprint's case form, whose
        # TMA descriptor blocks are the forward's key tiles
        compiles = [("fwd", kernels._fwd_kernel, tile, launch.fwd_flags(configs, flags), False)
                    for tile in dict.fromkeys((configs.fwd, configs.fwd_long))]
        compiles.append((launch.dkdv_kernel_name(dkdv), kernels._bwd_dkdv_kernel, configs.dkdv, dkdv,
                         dq_atomic))
        if not dq_atomic:
            compiles.append(("dq", kernels._bwd_dq_kernel, configs.dq, launch.dq_flags(configs, flags),
                             False))
        for name, kernel, tile, extra, dq_fp32 in compiles:
            row = dict(variant=label, kernel=name, config=str(tile))
            try:
                compiled = compile_fused((name, kernel, tile, tile.block_n, extra, common, "bf16", dq_fp32))
            except Exception as err:  # noqa: BLE001  (e.g. out of shared memory: a finding)
                rows.append(dict(row, error=first_line(err, 120)))
                continue
            row.update(_resource_usage(compiled.asm["cubin"], cuobjdump), shared=compiled.metadata.shared)
            sass = sass_of(compiled.asm["cubin"], cuobjdump)
            counts = sass_opcodes(sass)
            row.update(instructions=sum(counts.values()), **{op: counts.get(op, 0) for op in CENSUS})
            if keep_sass:
                row["sass"] = sass
            rows.append(row)
    return rows


def main(argv=None) -> int:
    """python -m lab.kernels.kernel_report [--head-dim D] [LABEL:]SPEC ... (offline, no GPU)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m lab.kernels.kernel_report", description=offline_rows.__doc__)
    parser.add_argument("variants", nargs="*", metavar="[LABEL:]SPEC")
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--csv", type=Path, default=None)
    args = parser.parse_args(argv)
    if find_cuobjdump() is None:
        raise SystemExit("kernel_report: no cuobjdump (triton's bundled one or on PATH)")
    from lab.kernels.variants import parse_variant, variant_configs

    specs = {"default": ""}
    for item in args.variants:
        label, sep, spec = item.partition(":")
        specs[label if sep else item] = spec if sep else item
    rows = offline_rows({label: variant_configs(parse_variant(spec), args.head_dim)
                         for label, spec in specs.items()}, args.head_dim)
    columns = ["variant", "kernel", "config", "reg", "stack", "shared", "instructions", "HGMMA", "HMMA",
               "MUFU", "FFMA", "FMUL", "FADD", "LDL", "STL", "REDG", "error"]
    print("| " + " | ".join(columns) + " |\n|" + "---|" * len(columns))
    for row in rows:
        print("| " + " | ".join(str(row.get(c, "")) for c in columns) + " |")
    if args.csv:
        write_csv(args.csv, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
