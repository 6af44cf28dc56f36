"""Outputs of the theory Monte Carlo: CSV, the two-panel plot, a summary table and a README."""

from __future__ import annotations

import csv
import datetime
import os
import platform
from pathlib import Path

import numpy as np
import torch

from tapa.theory.monte_carlo import METHODS, TheoryConfig, exact_moments, sigma_squared

CSV_FIELDS = ("distance", "method", "mean", "mean_se", "var", "var_se", "exact_mean", "exact_var")
SUMMARY_DISTANCES = (10, 1_000, 100_000)
_COLORS = {"rope": "tab:red", "tapa": "tab:blue", "tapa-linear-phase": "tab:green"}


def write_csv(rows: list[dict], path: Path) -> None:
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=CSV_FIELDS)
        writer.writeheader()
        for row in rows:
            writer.writerow({key: row[key] for key in CSV_FIELDS})


def read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as handle:
        return [{key: (value if key == "method" else int(value) if key == "distance"
                       else float(value)) for key, value in row.items()}
                for row in csv.DictReader(handle)]


def lookup(rows: list[dict], method: str, distance: int) -> dict:
    for row in rows:
        if row["method"] == method and row["distance"] == distance:
            return row
    raise KeyError(f"no row for method={method!r} at distance={distance}")


def summary_table(rows: list[dict], cfg: TheoryConfig) -> str:
    """Markdown: |E| +- SE and Var +- SE at distances 10, 1k, 100k for each method."""
    distances = [d for d in SUMMARY_DISTANCES if any(r["distance"] == d for r in rows)]
    # "\|" keeps the absolute-value bars from splitting markdown table cells
    header = "| method | " + " | ".join(f"\\|E\\| at {d:,}" for d in distances) + " | " + \
        " | ".join(f"Var at {d:,}" for d in distances) + " |"
    lines = [header, "|" + "---|" * (1 + 2 * len(distances))]
    for method in METHODS:
        cells = [lookup(rows, method, d) for d in distances]
        means = [f"{abs(c['mean']):.4f} ± {c['mean_se']:.4f}" for c in cells]
        variances = [f"{c['var']:.3f} ± {c['var_se']:.3f}" for c in cells]
        lines.append(f"| {method} | " + " | ".join(means + variances) + " |")
    lines.append("")
    lines.append(f"sigma^2 = E[A^2] = {sigma_squared(cfg):.4f}, so sigma^2/2 = "
                 f"{sigma_squared(cfg) / 2:.4f} (± values are one Monte Carlo standard error).")
    return "\n".join(lines)


def plot(rows: list[dict], cfg: TheoryConfig, path: Path) -> None:
    """Two panels, log x: E[logit] and Var[logit] vs distance; dots +-2 SE, lines closed form."""
    from tapa._optional import require
    matplotlib = require("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dense = np.unique(np.round(np.logspace(0, np.log10(cfg.max_distance), 1500)).astype(int))
    fig, (ax_mean, ax_var) = plt.subplots(1, 2, figsize=(13, 4.8))
    for method in METHODS:
        mine = sorted((r for r in rows if r["method"] == method), key=lambda r: r["distance"])
        dist = [r["distance"] for r in mine]
        color = _COLORS[method]
        exact = np.array([exact_moments(method, int(d), cfg) for d in dense])
        line_alpha, z = (0.35, 1) if method == "rope" else (0.9, 2)  # RoPE's band behind
        ax_mean.plot(dense, exact[:, 0], color=color, lw=0.7, alpha=line_alpha, zorder=z)
        ax_var.plot(dense, exact[:, 1], color=color, lw=0.7, alpha=line_alpha, zorder=z)
        ax_mean.errorbar(dist, [r["mean"] for r in mine], yerr=[2 * r["mean_se"] for r in mine],
                         fmt="o", ms=3.5, color=color, label=method, zorder=3)
        ax_var.errorbar(dist, [r["var"] for r in mine], yerr=[2 * r["var_se"] for r in mine],
                        fmt="o", ms=3.5, color=color, label=method, zorder=3)
    ax_mean.axhline(0, color="black", lw=0.6)
    ax_var.axhline(sigma_squared(cfg) / 2, color="black", ls="--", lw=0.8,
                   label=r"$\sigma^2/2$ (TAPA's long-range limit)")
    for ax, title in ((ax_mean, "E[logit] vs distance"), (ax_var, "Var[logit] vs distance")):
        ax.set_xscale("log")
        ax.set_xlabel("distance |m - n|")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    ax_mean.legend(fontsize=8)
    ax_var.legend(fontsize=8)
    fig.suptitle(f"Monte Carlo, {cfg.samples:,} samples per distance (dots ±2 SE; lines: closed "
                 f"form). D={cfg.head_dim}, theta={cfg.theta}, alpha={cfg.alpha}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def hardware_description() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as handle:
            names = [line.split(":", 1)[1].strip() for line in handle
                     if line.startswith("model name")]
        if names:
            cpu = names[0]
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (f"{cpu}, {cores} CPU cores, torch {torch.__version__} (the Monte Carlo runs on one "
            f"thread), Python {platform.python_version()}")


def write_readme(path: Path, rows: list[dict], cfg: TheoryConfig, *, command: str,
                 seconds: float, measured_sigma2: tuple[float, float]) -> None:
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    decay = []
    for method in METHODS:
        near, mid, far = (lookup(rows, method, d) for d in SUMMARY_DISTANCES)
        decay.append(
            f"- {method}: |E| = {abs(near['mean']):.4f} at 10, {abs(mid['mean']):.4f} at 1k, "
            f"{abs(far['mean']):.4f} at 100k (closed form {abs(far['exact_mean']):.2g}); at 100k "
            f"|E| is {abs(far['mean']) / far['mean_se']:.1f} standard errors from zero")
    config = ", ".join(f"{key}={value}" for key, value in cfg.to_dict().items())
    text = f"""# Theory: logit mean and variance vs distance (RoPE vs TAPA)

Generated by `tapa theory`; everything below comes from that run.

- Command: `{command}`
- Date: {date}; wall time {seconds:.1f} s (Monte Carlo only; it depends on the machine's load)
- Hardware: {hardware_description()}
- Configuration: {config}
- Files: `theory.csv` (one row per method and distance: Monte Carlo mean, variance, their
  standard errors, and the closed-form values), `theory.png` (left: E[logit]; right: Var[logit];
  log distance axis; dots are Monte Carlo ±2 SE, lines the closed forms).

The setting, the closed forms and the choice of parameters are documented in
`tapa.theory.monte_carlo`. q and k are independent Gaussians with a nonzero mean; TAPA's logits
come from `tapa.ops.tapa.reference.tapa_logits` and RoPE's from `tapa.positional`.

## Summary (|E| ± SE and Var ± SE)

{summary_table(rows, cfg)}

Monte Carlo check of sigma^2 (mean square of TAPA's distance-0 logit, which is the amplitude
score itself): {measured_sigma2[0]:.4f} ± {measured_sigma2[1]:.4f}.

## Decay of |E[logit]| with distance

{chr(10).join(decay)}

RoPE's mean at a single distance depends on where its oscillation happens to be; the plot shows
the whole curve (its closed form is a sum of undamped cosines and sines of the distance).
"""
    path.write_text(text)
