"""`tapa theory`: Monte Carlo of the logit's mean and variance vs distance, RoPE against TAPA."""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

from tapa._paths import check_output_dir, replacing_outputs
from tapa.theory.monte_carlo import TheoryConfig, measured_sigma_squared, run_monte_carlo
from tapa.theory.report import plot, summary_table, write_csv, write_readme


OUTPUTS = ("theory.csv", "theory.png", "README.md")  # theory.csv marks a folder as this command's


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = TheoryConfig()
    parser.add_argument("--out", type=Path, default=Path("runs/theory"),
                        help="output folder for theory.csv, theory.png and README.md (default: %(default)s)")
    parser.add_argument("--overwrite", action="store_true",
                        help="write into --out even if it holds files tapa theory did not write")
    parser.add_argument("--samples", type=int, default=defaults.samples,
                        help="Monte Carlo samples per distance")
    parser.add_argument("--points-per-decade", type=int, default=defaults.points_per_decade,
                        help="distances per factor of ten (1 .. max-distance)")
    parser.add_argument("--max-distance", type=int, default=defaults.max_distance)
    parser.add_argument("--head-dim", type=int, default=defaults.head_dim)
    parser.add_argument("--theta", type=float, default=defaults.theta,
                        help="TAPA amplitude fraction of the head dim")
    parser.add_argument("--alpha", type=float, default=defaults.alpha,
                        help="TAPA distance exponent, f(d) = d ** alpha")
    parser.add_argument("--rope-base", type=float, default=defaults.rope_base)
    parser.add_argument("--phase-std", type=float, default=defaults.phase_std,
                        help="std of q and k in the phase dims (see tapa.theory.monte_carlo)")
    parser.add_argument("--phase-mean-q", type=float, default=defaults.phase_mean_q)
    parser.add_argument("--phase-mean-k", type=float, default=defaults.phase_mean_k)
    parser.add_argument("--amp-mean", type=float, default=defaults.amp_mean_q,
                        help="mean of q and k in the amplitude dims")
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    cfg = TheoryConfig(head_dim=args.head_dim, theta=args.theta, alpha=args.alpha,
                       rope_base=args.rope_base, amp_mean_q=args.amp_mean, amp_mean_k=args.amp_mean,
                       phase_mean_q=args.phase_mean_q, phase_mean_k=args.phase_mean_k,
                       phase_std=args.phase_std, samples=args.samples,
                       max_distance=args.max_distance, points_per_decade=args.points_per_decade,
                       seed=args.seed)
    check_output_dir(args.out, outputs=OUTPUTS, marker=OUTPUTS[0], overwrite=args.overwrite,
                     command="tapa theory")
    start = time.perf_counter()
    rows = run_monte_carlo(cfg, progress=not args.no_progress)
    sigma2 = measured_sigma_squared(cfg)
    seconds = time.perf_counter() - start
    command = "tapa theory" + "".join(" " + shlex.quote(a) for a in sys.argv[2:]) \
        if Path(sys.argv[0]).name == "tapa" else "tapa theory (called from Python)"
    with replacing_outputs(args.out, OUTPUTS) as out:
        csv_path, png_path, readme_path = (out / name for name in OUTPUTS)
        write_csv(rows, csv_path)
        plot(rows, cfg, png_path)
        write_readme(readme_path, rows, cfg, command=command, seconds=seconds, measured_sigma2=sigma2)
    print(summary_table(rows, cfg))
    print(f"\n{len(rows)} estimates in {seconds:.1f} s. "
          f"Wrote {csv_path}, {png_path}, {readme_path}")
    return 0
