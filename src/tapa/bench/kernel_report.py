"""Compiler evidence for the fused kernels: registers, spills, shared memory and an opcode census
of each compiled kernel variant that ran in this process (`triton_launch.compiled_kernels`).

The census reads the SASS (cuobjdump on the cubin Triton built; Triton ships one) and counts the
instructions that decide the speed of these kernels: tensor-core ops (HGMMA is Hopper's wgmma,
HMMA the older mma.sync), MUFU (exp2, log2, cos), the FMA-pipe float ops, local-memory traffic
(LDL/STL: spills), shared and global memory ops and float32 atomics (REDG). Counts are static (each
instruction once, wherever it sits), so they compare variants of one kernel, not run time.
Without cuobjdump the same census runs on the PTX.
"""

from __future__ import annotations

import collections
import csv
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

CENSUS = ("HGMMA", "HMMA", "MUFU", "FFMA", "FMUL", "FADD", "FMNMX", "FSEL", "FSETP", "F2F", "F2FP",
          "I2F", "I2FP", "F2I", "LDL", "STL", "LDS", "STS", "LDSM", "STSM", "LDG", "STG", "LDGSTS",
          "UTMALDG", "REDG", "RED", "ATOMG", "ATOM", "BAR", "SHFL", "WARPGROUP")
PTX_CENSUS = ("wgmma", "mma", "ex2", "lg2", "cos", "sin", "fma", "mul", "add", "sub", "max", "ld",
              "st", "red", "atom", "bar", "shfl", "cvt")
# "/*0a80*/   @!P0 FFMA.FTZ R3, R2, R5, R3 ;" -> FFMA
_SASS_LINE = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)")
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


def sass_of(cubin: bytes, cuobjdump: str) -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as handle:
        handle.write(cubin)
        handle.flush()
        return subprocess.run([cuobjdump, "-sass", handle.name], capture_output=True, text=True,
                              check=True, timeout=120).stdout


def sass_opcodes(sass: str) -> collections.Counter:
    """Opcode (without modifiers) -> count, over the instruction lines of a cuobjdump -sass text."""
    return collections.Counter(match.group(1) for match in map(_SASS_LINE.search, sass.splitlines())
                               if match)


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
            result = ("none", collections.Counter(), None, str(err).splitlines()[0][:200])
    if result[2] is None and "ptx" in asm:
        result = ("ptx", ptx_opcodes(asm["ptx"]), asm["ptx"], result[3])
    _census_cache[id(compiled)] = result
    return result


def kernel_rows(dump_dir: Path | None = None, dump_kernels: frozenset = frozenset()) -> list[dict]:
    """One row per compiled kernel: its description, n_regs/n_spills/shared and the census.

    The SASS (or PTX) of the first kernel seen of each name in dump_kernels goes to dump_dir.
    """
    from tapa.ops import triton_launch

    cuobjdump = find_cuobjdump()
    rows, dumped = [], set()
    for description, compiled in triton_launch.compiled_kernels():
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


def write_csv(path: Path, rows: list[dict]) -> None:
    if not rows:
        return
    columns = list(dict.fromkeys(key for row in rows for key in row))
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns, restval="")
        writer.writeheader()
        writer.writerows(rows)


def markdown(rows: list[dict]) -> str:
    """A short table: kernel, config, flags that differ between rows, registers, spills, census."""
    if not rows:
        return ""
    fixed = ("kernel", "config", "n_regs", "n_spills", "shared", "instructions")
    flags = [key for key in ("TRIG_POLY", "TRIG_TERMS", "TAYLOR_ORDER", "LONG_PHASE", "HEAD_DIM")
             if len({str(r.get(key)) for r in rows}) > 1]
    census = [name for name in (*CENSUS, *PTX_CENSUS) if any(r.get(name) for r in rows)]
    columns = [*fixed[:2], *flags, *fixed[2:], *census]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in sorted(rows, key=lambda r: (r["kernel"], r["config"])):
        lines.append("| " + " | ".join(str(row.get(c, "")) for c in columns) + " |")
    return "\n".join(lines) + "\n"
