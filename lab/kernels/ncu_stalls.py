"""What the warps of each profiled kernel wait on, from Nsight Compute's raw pages
(`ncu --import X.ncu-rep --page raw > X_raw.txt`, as the device scripts write them): a markdown
table of time, issue activity, warps per scheduler and the stall reasons, each as warps in that
state per issue cycle (smsp__average_warps_issue_stalled_*_per_issue_active.ratio; the reasons of
one kernel add up to its warps per scheduler over its issue rate).

    python3 lab/kernels/ncu_stalls.py WORK/ncu/*_raw.txt
"""
import re
import sys
from pathlib import Path

STALL = re.compile(r"^\s+smsp__average_warps_issue_stalled_([a-z_]+)_per_issue_active\.ratio\s+\S+\s+([\d.,]+)\s*$")
SHOWN = ("selected", "not_selected", "wait", "mio_throttle", "dispatch_stall", "barrier",
         "long_scoreboard", "short_scoreboard", "math_pipe_throttle", "gmma")
SCALARS = {"gpu__time_duration.sum": "ms", "smsp__issue_active.avg.per_cycle_active": "issue / cycle",
           "smsp__warps_active.avg.per_cycle_active": "warps / scheduler",
           "smsp__warps_eligible.avg.per_cycle_active": "eligible / cycle",
           "smsp__inst_executed.sum": "instructions (warp)"}
TO_MS = {"ns": 1e-6, "us": 1e-3, "usecond": 1e-3, "ms": 1.0, "msecond": 1.0, "s": 1e3, "second": 1e3}


def read(path: Path) -> tuple[dict, dict]:
    scalars, stalls = {}, {}
    for line in path.read_text().splitlines():
        match = STALL.match(line)
        if match:
            stalls[match.group(1)] = float(match.group(2).replace(",", ""))
            continue
        fields = line.split()
        if fields and fields[0] in SCALARS and fields[0] not in scalars:
            value = float(fields[-1].replace(",", ""))
            if fields[0] == "gpu__time_duration.sum":  # ncu picks the unit: ns, us, ms or s
                if fields[-2] not in TO_MS:
                    raise SystemExit(f"{path}: gpu__time_duration.sum in an unknown unit {fields[-2]!r}")
                value *= TO_MS[fields[-2]]
            scalars[fields[0]] = value
    if not stalls or "gpu__time_duration.sum" not in scalars:
        raise SystemExit(f"{path}: no raw ncu metrics with the WarpStateStats stall ratios")
    return scalars, stalls


def main(paths: list[str]) -> None:
    if not paths:
        raise SystemExit(__doc__)
    head = list(SCALARS.values()) + list(SHOWN) + ["other"]
    print("| kernel | " + " | ".join(head) + " |")
    print("|---" * (len(head) + 1) + "|")
    for path in map(Path, paths):
        scalars, stalls = read(path)
        other = sum(v for k, v in stalls.items() if k not in SHOWN)
        cells = [f"{scalars.get(name, float('nan')):.4g}" for name in SCALARS]
        cells += [f"{stalls.get(name, 0.0):.2f}" for name in SHOWN] + [f"{other:.2f}"]
        print(f"| {path.name.removesuffix('_raw.txt')} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
