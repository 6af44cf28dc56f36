"""How often can the screen's goal test see a true difference? A Monte Carlo of its criterion.

    python3 -m lab.study.power --sd 0.15 --diffs 0.1,0.2,0.3,0.4,0.5 --seeds 3

The goal table (lab/study/screen.py, `goal_table`) calls a measure met when both one-sided tests,
Welch's t and the exact Mann-Whitney, give p <= 0.05 that the TAPA arm is better (`goal_p`, which
this applies as it is). This draws both
arms' seeds from normal distributions with the same standard deviation (--sd, e.g. the seed spread
the screen measured) whose means differ by each of --diffs in TAPA's favour, applies that same
criterion, and prints the share of draws that meet it: the test's power for one measure. With 3
seeds a side the exact Mann-Whitney p is at least 0.05, reached only when every TAPA seed is better
than every NoPE seed.
"""

from __future__ import annotations

import argparse

import numpy as np

from lab.study.screen import GOAL_P, goal_p


def power(diff: float, sd: float, seeds: int = 3, trials: int = 2000, seed: int = 0) -> float:
    """Share of `trials` draws in which `seeds` TAPA values, normal with mean 0, and as many NoPE
    values, normal with mean `diff` (both with standard deviation `sd`; lower is better), meet the
    goal's criterion for one measure."""
    if sd <= 0 or seeds < 2 or trials < 1:
        raise ValueError(f"need sd > 0, seeds >= 2 and trials >= 1, not {sd}, {seeds}, {trials}")
    rng = np.random.default_rng(seed)
    met = 0
    for _ in range(trials):
        tapa, nope = rng.normal(0.0, sd, seeds), rng.normal(diff, sd, seeds)
        met += goal_p(tapa.tolist(), nope.tolist(), lower_is_better=True) <= GOAL_P
    return met / trials


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m lab.study.power", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sd", type=float, required=True, help="the seeds' standard deviation")
    parser.add_argument("--diffs", required=True, help="comma-separated true differences of the means")
    parser.add_argument("--seeds", type=int, default=3, help="seeds a side (default 3)")
    parser.add_argument("--trials", type=int, default=2000)
    args = parser.parse_args(argv)
    try:
        diffs = [float(d) for d in args.diffs.split(",")]
        rows = [(d, power(d, args.sd, args.seeds, args.trials)) for d in diffs]
    except ValueError as err:
        raise SystemExit(f"lab.study.power: {err}") from err
    print(f"| true difference | power ({args.seeds} seeds a side, sd {args.sd:g}, {args.trials} draws) |")
    print("|---|---|")
    for diff, share in rows:
        print(f"| {diff:g} | {share:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
