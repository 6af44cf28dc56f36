"""lab/study/gpu_repeat_probe.sh's two helpers: a study arm's pretraining flags for `tapa train`,
and the comparison of two runs of one command.

    python3 -m lab.study.repeat_probe flags ARM LR [--protocol toy-gpu]
    python3 -m lab.study.repeat_probe protocol NAME FIELD            (recipe, data)
    python3 -m lab.study.repeat_probe compare NAME MODE RUN_DIR_1 RUN_DIR_2
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from lab.study.arms import ARMS, PROTOCOLS
from lab.study.plan import pretrain_flags
from tapa.train.rundir import read_metrics


def arm_flags(arm: str, lr: float, protocol: str = "toy-gpu") -> list[str]:
    """The arm's pretraining flags and lr as the study's runner gives them under `protocol` (its
    model and the arm's flags)."""
    if arm not in ARMS:
        raise ValueError(f"unknown arm {arm!r}; the study's arms: {', '.join(sorted(ARMS))}")
    return pretrain_flags(ARMS[arm], PROTOCOLS[protocol], lr)


def protocol_field(protocol: str, name: str) -> str:
    """A protocol's `recipe` or `data` as the probe passes it to `tapa train` (data space-separated)."""
    if name not in ("recipe", "data"):
        raise ValueError(f"the probe reads a protocol's recipe or data, not {name!r}")
    value = getattr(PROTOCOLS[protocol], name)
    return value if isinstance(value, str) else " ".join(value)


def compare_curves(first: list[dict], second: list[dict]) -> dict:
    """Two runs' logged losses step by step: how many steps both logged, the first step whose losses
    differ (None: bitwise equal over the steps both logged), the largest absolute difference, and how
many steps each logged (a run cut short compares only the steps it reached)."""
    second_by_step = {row["step"]: row["loss"] for row in second if "loss" in row}
    pairs = [(row["step"], row["loss"], second_by_step[row["step"]])
             for row in first if "loss" in row and row["step"] in second_by_step]
    return {"logged": len(pairs),
            "logged_each": (sum("loss" in row for row in first), len(second_by_step)),
            "first_differing_step": next((step for step, a, b in pairs if a != b), None),
            "max_abs_difference": max((abs(a - b) for _, a, b in pairs), default=math.nan)}


def _steady_rate(curve: list[dict]) -> float:
    rates = [row["tokens_per_s"] for row in curve if "tokens_per_s" in row][-5:]
    return sum(rates) / len(rates) if rates else math.nan


def summary_row(name: str, mode: str, runs: list[Path]) -> str:
    """One markdown row of the probe's summary for a pair of run directories."""
    curves = [read_metrics(run / "metrics.jsonl") if (run / "metrics.jsonl").is_file() else []
              for run in runs]
    result = compare_curves(*curves)
    step = result["first_differing_step"]
    if not result["logged"]:
        verdict = "no losses to compare (a run failed: its log says why)"
    else:
        verdict = "none (bitwise equal)" if step is None else str(step)
        if len(set(result["logged_each"])) > 1:
            verdict += " (the runs logged {} and {} steps: one stopped early)".format(*result["logged_each"])
    return (f"| {name} | {mode} | {result['logged']} | {verdict} | {result['max_abs_difference']:.3g} | "
            + " / ".join(f"{_steady_rate(c) / 1e3:.0f}k" for c in curves) + " |")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m lab.study.repeat_probe", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    flags = sub.add_parser("flags", help="an arm's pretraining flags and lr, space-separated")
    flags.add_argument("arm")
    flags.add_argument("lr", type=float)
    flags.add_argument("--protocol", default="toy-gpu", choices=sorted(PROTOCOLS))
    field = sub.add_parser("protocol", help="a protocol's recipe or data flags")
    field.add_argument("protocol", choices=sorted(PROTOCOLS))
    field.add_argument("field", choices=("recipe", "data"))
    compare = sub.add_parser("compare", help="a markdown row comparing two runs' logged losses")
    compare.add_argument("name")
    compare.add_argument("mode")
    compare.add_argument("runs", nargs=2, type=Path)
    args = parser.parse_args(argv)
    if args.command == "flags":
        try:
            print(" ".join(arm_flags(args.arm, args.lr, args.protocol)))
        except ValueError as error:
            parser.error(str(error))
    elif args.command == "protocol":
        print(protocol_field(args.protocol, args.field))
    else:
        print(summary_row(args.name, args.mode, args.runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
