"""Per-score SASS census of a fused kernel's loops, offline (sm_90, no GPU).

Compiles the shipped bf16 causal kernels as `lab.kernels.kernel_report.offline_rows` does (the
launcher's specialization), optionally writes the SASS, and for each loop of the chosen kernel
(`--kernel`: the forward, by default, the dK/dV or the dQ kernel; the unmasked tiles, then the
masked ones, or for the dK/dV kernel the masked ones first) splits the body into the part both tile paths share and the
two arms of the far/near branch (the arm with the MUFU.LG2s is the near one). It prints the
instruction classes of each part per iteration and per score of a thread (BLOCK_M * BLOCK_N /
(32 * num_warps) scores). Counts are static: each instruction of one iteration once.

    PYTHONPATH=src python3 -m lab.kernels.fwd_loop_census --head-dim 64 --sass-dir /tmp/sass
    PYTHONPATH=src python3 -m lab.kernels.fwd_loop_census --head-dim 64 --variant fwd_split_s=1
    PYTHONPATH=src python3 -m lab.kernels.fwd_loop_census --head-dim 64 --kernel dq
    PYTHONPATH=src python3 -m lab.kernels.fwd_loop_census --head-dim 64 --paths
"""

from __future__ import annotations

import argparse
import collections
import re
from pathlib import Path

from lab.kernels import kernel_report
from lab.kernels.variants import parse_variant, variant_configs

CLASSES = (
    ("fp32 arith", {"FFMA", "FMUL", "FADD"}),
    ("fp32 cmp/sel", {"FMNMX", "FSEL", "FSETP", "FSET"}),
    ("MUFU", {"MUFU"}),
    ("conversion", {"F2F", "F2FP", "I2F", "I2FP", "F2I", "F2IP", "FRND"}),
    ("IMAD", {"IMAD", "IMUL"}),
    ("int/logic", {"IADD3", "LOP3", "SHF", "LEA", "ISETP", "SEL", "IABS", "IMNMX", "PRMT", "VIADD", "PLOP3"}),
    ("move", {"MOV", "CS2R", "S2R"}),
    ("tensor", {"HGMMA", "WARPGROUP", "HMMA"}),
    ("memory/sync", {"LDG", "LDGSTS", "LDS", "STS", "LDSM", "BAR", "DEPBAR", "LDGDEPBAR", "LDL", "STL"}),
    ("shuffle", {"SHFL"}),
    ("control", {"BRA", "NOP", "BSSY", "BSYNC", "WARPSYNC"}),
)


def klass(op: str) -> str:
    for name, ops in CLASSES:
        if op in ops:
            return name
    return "uniform" if op.startswith("U") or op in ("R2UR", "S2UR") else "other"


def loops(ins: list[dict]) -> list[dict]:
    """Each loop (a predicated backward BRA) with its if/else arms: a forward predicated BRA to X
    whose fall-through ends in an unconditional BRA at X - 0x10 (None when there is none)."""
    branches = [(i["addr"], int(m.group(1), 16), i["pred"]) for i in ins if i["op"] == "BRA"
                and (m := re.match(r"(0x[0-9a-f]+)", i["args"]))]
    found = []
    for end, start, pred in branches:
        if start >= end or not pred:
            continue
        arms = None
        for at, x, p in branches:
            if start <= at < end and x > at and p:
                tail = [y for a, y, q in branches if a == x - 0x10 and not q and x < y <= end]
                if tail:
                    arms = ((at + 0x10, x - 0x10), (x, tail[0] - 0x10))
                    break
        found.append(dict(start=start, end=end, arms=arms))
    return found


def paths(body: list[dict], limit: int = 64) -> list[collections.Counter]:
    """The opcode counts of every path through one iteration of a loop body (its instructions in
    address order, the loop's backward BRA last): a predicated forward BRA forks, an
    unconditional one jumps, a backward one inside the body (a barrier's wait loop) and a
    predicated one out of it (a detour to a wait loop placed after the loop, as TMA's are) are
    taken as not taken, and an unconditional branch out of the body ends the path uncounted. For
    nested far/near arms (far_bands), where `census`'s two arms no longer describe a tile."""
    index = {i["addr"]: n for n, i in enumerate(body)}
    found: list[collections.Counter] = []
    stack = [(0, collections.Counter())]
    while stack and len(found) < limit:
        n, counts = stack.pop()
        while n < len(body):
            i = body[n]
            counts[i["op"] + (i["mods"] if i["op"] == "MUFU" else "")] += 1
            m = re.match(r"(0x[0-9a-f]+)", i["args"]) if i["op"] == "BRA" else None
            if m is None:
                n += 1
                continue
            target = int(m.group(1), 16)
            if n == len(body) - 1:  # the loop's own backward branch: one iteration done
                found.append(counts)
                break
            if target <= i["addr"] or (target not in index and i["pred"]):
                n += 1  # a wait loop inside the body, or a predicated detour to one after it
            elif target not in index:  # out of the loop
                break
            elif i["pred"]:
                stack.append((index[target], counts.copy()))
                n += 1
            else:
                n = index[target]
    unique = {tuple(sorted(c.items())): c for c in found}
    return sorted(unique.values(), key=lambda c: sum(c.values()))


def path_table(ins: list[dict], scores: int) -> str:
    lines = []
    for number, loop in enumerate(loops(ins), 1):
        body = [i for i in ins if loop["start"] <= i["addr"] <= loop["end"]]
        found = paths(body)
        if len(found) < 2:
            continue
        lines.append(f"\nloop {number} [{loop['start']:#x}, {loop['end']:#x}]: {len(found)} paths")
        lines.append("| instructions | per score | FFMA | MUFU.LG2 | MUFU.EX2 | BRA |")
        lines.append("|---|---|---|---|---|---|")
        for counts in found:
            total = sum(counts.values())
            cells = (total, f"{total / scores:.2f}", counts["FFMA"], counts["MUFU.LG2"],
                     counts["MUFU.EX2"], counts["BRA"])
            lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def census(ins: list[dict], scores: int) -> str:
    lines = []
    for number, loop in enumerate(loops(ins), 1):
        body = [i for i in ins if loop["start"] <= i["addr"] <= loop["end"]]
        parts = {"shared": body}
        if loop["arms"]:
            arms = [[i for i in body if lo <= i["addr"] <= hi] for lo, hi in loop["arms"]]
            arms.sort(key=lambda arm: sum(i["op"] == "MUFU" and ".LG2" in i["mods"] for i in arm))
            inside = {i["addr"] for arm in arms for i in arm}
            parts = {"shared": [i for i in body if i["addr"] not in inside], "far arm": arms[0],
                     "near arm": arms[1]}
        counts = {name: collections.Counter(klass(i["op"]) for i in part) for name, part in parts.items()}
        far = counts["shared"] + counts.get("far arm", collections.Counter())
        lines.append(f"\nloop {number} [{loop['start']:#x}, {loop['end']:#x}]: {len(body)} instructions; "
                     + ", ".join(f"{name} {len(part)}" for name, part in parts.items()))
        lines.append(f"| class | {' | '.join(parts)} | far-tile iteration | per score |")
        lines.append("|---|" + "---|" * (len(parts) + 2))
        for name in [c for c, _ in CLASSES] + ["uniform", "other"]:
            if any(c[name] for c in counts.values()):
                lines.append(f"| {name} | " + " | ".join(str(c[name]) for c in counts.values())
                             + f" | {far[name]} | {far[name] / scores:.2f} |")
        total = sum(far.values())
        lines.append("| total | " + " | ".join(str(sum(c.values())) for c in counts.values())
                     + f" | {total} | {total / scores:.2f} |")
        ops = collections.Counter(i["op"] + (i["mods"] if i["op"] == "MUFU" else "")
                                  for name, part in parts.items() if name != "near arm" for i in part)
        lines.append("far-tile iteration opcodes: " + ", ".join(f"{op} {n}" for op, n in ops.most_common()))
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--kernel", choices=("fwd", "dkdv", "dq"), default="fwd",
                        help="the kernel whose loops are counted (dkdv: whichever dK/dV kernel the "
                        "configs launch, with or without the atomic dQ)")
    parser.add_argument("--sass-dir", type=Path, default=None, help="write each kernel's SASS here")
    parser.add_argument("--variant", default="", help="a kernel variant spec (lab.kernels.variants' "
                        "form) applied to the table's row")
    parser.add_argument("--paths", action="store_true", help="also each loop's paths through one "
                        "iteration (instructions, FFMA, MUFU.LG2 per path; for nested arms)")
    args = parser.parse_args()
    configs = variant_configs(parse_variant(args.variant), args.head_dim)
    rows = kernel_report.offline_rows({args.variant or "default": configs}, args.head_dim, keep_sass=True)
    for row in rows:
        if not row["kernel"].startswith(args.kernel) or "error" in row:
            continue
        text = row["sass"]
        block_m, block_n, warps = (int(x) for x in re.match(r"(\d+)x(\d+)/(\d+)", row["config"]).groups())
        scores = block_m * block_n // (32 * warps)
        print(f"\n## D={args.head_dim} {row['kernel']} {row['config']}: {row['reg']} registers, {row['stack']} B stack, "
              f"{scores} scores per thread per iteration")
        if args.sass_dir:
            args.sass_dir.mkdir(parents=True, exist_ok=True)
            name = f"{args.kernel}_D{args.head_dim}_{row['config'].split()[0].replace('/', '-')}"
            path = args.sass_dir / (name + (f"_{args.variant.replace('=', '').replace(',', '_')}" if args.variant else "") + ".sass")
            path.write_text(text)
            print(f"SASS: {path}")
        ins = kernel_report.sass_instructions(text)
        print(census(ins, scores))
        if args.paths:
            print(path_table(ins, scores))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
