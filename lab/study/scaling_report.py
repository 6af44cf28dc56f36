"""Summarize a multi-GPU check (scripts/multi_gpu_check.sh): tokens/s on 1 vs N GPUs with DDP
and FSDP2, the scaling ratio, loss curves of N GPUs against 1 GPU, and checkpoint resumes.

Run directories are named <recipe>-<mode>-<gpus> (e.g. toy-gpu-fsdp-2); resumed copies
<recipe>-<mode>-<gpus>-resume<gpus>. Throughput is the median of the logged tokens/s after the
first `skip` records (compilation, autotuning, allocator warmup).

    python -m lab.study.scaling_report runs/multigpu --out results/multi-gpu-h200
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path

from lab.study.aggregate import save_png
from tapa.train.rundir import read_metrics

RUN_NAME = re.compile(r"^(?P<recipe>.+)-(?P<mode>ddp|fsdp)-(?P<gpus>\d+)(?:-resume(?P<resumed>\d+))?$")


def _records(run_dir: Path) -> list[dict]:
    return read_metrics(run_dir / "metrics.jsonl")


def collect(root: Path, skip: int = 5) -> list[dict]:
    runs = []
    for run_dir in sorted(p for p in root.iterdir() if (p / "metrics.jsonl").is_file()):
        match = RUN_NAME.match(run_dir.name)
        if not match or run_dir.name.startswith("_"):  # _saved-*: the checkpoint source
            continue
        records = _records(run_dir)
        steady = [r["tokens_per_s"] for r in records[skip:]] or [r["tokens_per_s"] for r in records]
        config = json.loads((run_dir / "config.json").read_text())
        runs.append({"name": run_dir.name, "recipe": match["recipe"], "mode": match["mode"],
                     "gpus": int(match["gpus"]), "resumed_on": match["resumed"] and int(match["resumed"]),
                     "params_m": float(f"{config['num_parameters'] / 1e6:.3g}"),
                     "seq_len": config["train"]["seq_len"], "device": config["device"],
                     "tokens_per_s": statistics.median(steady), "records": records})
    return runs


def _max_loss_gap(a: list[dict], b: list[dict]) -> float:
    by_step = {r["step"]: r["loss"] for r in b}
    gaps = [abs(r["loss"] - by_step[r["step"]]) for r in a if r["step"] in by_step]
    return max(gaps) if gaps else float("nan")


def report(root: Path, out: Path, command: str, skip: int = 5) -> str:
    runs = collect(root, skip)
    if not runs:
        raise ValueError(f"no run directories named <recipe>-<ddp|fsdp>-<gpus> under {str(root)!r}")
    fresh = [r for r in runs if r["resumed_on"] is None]
    lines = ["| recipe | params (M) | seq_len | mode | GPUs | tokens/s | x 1-GPU | max loss diff vs 1 GPU |",
             "|---|---|---|---|---|---|---|---|"]
    for run in fresh:
        one = next((r for r in fresh if (r["recipe"], r["mode"], r["gpus"]) ==
                    (run["recipe"], run["mode"], 1)), None)
        ratio = f"{run['tokens_per_s'] / one['tokens_per_s']:.2f}" if one else ""
        gap = f"{_max_loss_gap(run['records'], one['records']):.4f}" if one else ""
        lines.append(f"| {run['recipe']} | {run['params_m']} | {run['seq_len']} | {run['mode']} | "
                     f"{run['gpus']} | {run['tokens_per_s']:.0f} | {ratio} | {gap} |")
    resumed = [r for r in runs if r["resumed_on"] is not None]
    if resumed:
        lines += ["", "| checkpoint saved by | resumed on GPUs | max loss diff vs uninterrupted run |",
                  "|---|---|---|"]
        for run in resumed:
            base = next((r for r in fresh if (r["recipe"], r["mode"], r["gpus"]) ==
                         (run["recipe"], run["mode"], run["gpus"])), None)
            gap = f"{_max_loss_gap(run['records'], base['records']):.4f}" if base else "no baseline"
            lines.append(f"| {run['recipe']}-{run['mode']} on {run['gpus']} | {run['resumed_on']} | {gap} |")
    table = "\n".join(lines)
    out.mkdir(parents=True, exist_ok=True)
    devices = sorted({r["device"] for r in runs})
    (out / "README.md").write_text(
        f"# Multi-GPU training: DDP and FSDP2 scaling\n\n- Command: `{command}`\n"
        f"- Runs: {root}; devices: {', '.join(devices)}\n"
        f"- tokens/s: median over logged steps after the first {skip}\n\n{table}\n\n"
        "![loss curves](loss_curves.png)\n")
    (out / "runs.json").write_text(json.dumps([{k: v for k, v in r.items() if k != "records"}
                                               for r in runs], indent=2))
    _plot(fresh, out / "loss_curves.png")
    return table


def _plot(runs: list[dict], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    groups = sorted({(r["recipe"], r["mode"]) for r in runs})
    fig, axes = plt.subplots(1, len(groups), figsize=(5 * len(groups), 3.8), squeeze=False)
    for ax, (recipe, mode) in zip(axes[0], groups):
        for run in sorted((r for r in runs if (r["recipe"], r["mode"]) == (recipe, mode)),
                          key=lambda r: r["gpus"]):
            ax.plot([r["step"] for r in run["records"]], [r["loss"] for r in run["records"]],
                    "-" if run["gpus"] == 1 else "--", label=f"{run['gpus']} GPU", alpha=0.8)
        ax.set_title(f"{recipe}, {mode}")
        ax.set_xlabel("step")
        ax.set_ylabel("training loss")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    save_png(fig, path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", help="directory holding the run directories")
    parser.add_argument("--out", default="results/multi-gpu-h200")
    parser.add_argument("--skip", type=int, default=5, help="records to skip for throughput")
    parser.add_argument("--command", default="scripts/multi_gpu_check.sh",
                        help="the command to record in the README")
    args = parser.parse_args(argv)
    print(report(Path(args.root), Path(args.out), args.command, args.skip))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
