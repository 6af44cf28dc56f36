"""PNG plots of evaluation results: perplexity vs length, loss by window position, passkey and
retrieval-task heat maps.

Every function takes the plain dicts that `tapa eval` writes to results.json (see
`tapa.eval.evaluate`), so `tapa report` can redraw merged runs without the models. Every plot gives a
method the same colour (`method_color`), labels lengths as 128, 256, ..., 1k, 16k, and puts the
model size and training tokens in the title when the results know them.
"""

from __future__ import annotations

import math
import zlib
from pathlib import Path

from tapa._optional import require

# one colour per method in every plot (the theory plot uses the same red/blue/green)
METHOD_COLORS = {
    "RoPE": "#d62728", "PI": "#ff7f0e", "NTK": "#9467bd", "Dynamic NTK": "#8c564b", "YaRN": "#e377c2",
    "TAPA": "#1f77b4", "TAPA (linear phase)": "#2ca02c", "NoPE": "#7f7f7f",
    "TAPA hybrid": "#17becf", "NoPE hybrid": "#bcbd22", "RoPE hybrid": "#ad494a",
}
# unknown labels: a colour picked by a hash of the label, so it is the same in every plot and run
_FALLBACK_COLORS = ("#000000", "#a6761d", "#000080", "#006d2c", "#800000", "#6a3d9a")


def _pyplot():
    matplotlib = require("matplotlib")
    matplotlib.use("Agg")  # files only; never needs a display
    import matplotlib.pyplot as plt

    return plt


_MARKERS = ("o", "s", "^", "v", "D", "P", "X", "*")


def method_color(label: str) -> str:
    """The colour of a method label: 'RoPE', 'TAPA', 'TAPA hybrid (LLLG, w256)', a merged report's
    'run: RoPE', an eval-time variant 'RoPE+YaRN' (the colour of its rule, YaRN)."""
    name = label.split(": ", 1)[-1]  # tapa report prefixes clashing labels with the run name
    name = name.split("+")[-1]
    for candidate in (name, name.split(" (")[0]):
        if candidate in METHOD_COLORS:
            return METHOD_COLORS[candidate]
    return _FALLBACK_COLORS[zlib.crc32(name.encode("utf-8")) % len(_FALLBACK_COLORS)]


def _line_style(index: int, method: dict) -> dict:
    """The method's colour; distinct markers, so coinciding curves stay visible; eval-time
    variants (RoPE+X) dashed with hollow markers."""
    variant = "+" in method["label"]
    style = {"color": method_color(method["label"]), "marker": _MARKERS[index % len(_MARKERS)],
             "markersize": 9 - 1.5 * (index % 4), "linestyle": "--" if variant else "-"}
    if variant:
        style["markerfacecolor"] = "none"
    return style


def length_label(tokens: float) -> str:
    """128, 256, 512, 1k, 1.5k, 16k: binary thousands from 1024 on, plain numbers otherwise."""
    tokens = int(round(tokens))
    if tokens >= 1024 and tokens % 512 == 0:
        return f"{tokens / 1024:g}k"
    return str(tokens)


def _count_label(count: float) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if count >= size:
            return f"{count / size:.3g}{unit}"
    return f"{count:g}"


def size_note(methods: list[dict]) -> str:
    """'1.2M parameters, 2.05M training tokens' from the methods' num_parameters and train_tokens
    (a range when they differ; an unknown part is left out)."""
    parts = []
    for key, noun in (("num_parameters", "parameters"), ("train_tokens", "training tokens")):
        values = sorted({m[key] for m in methods if m.get(key)})
        if values:
            span = _count_label(values[0]) + (f"-{_count_label(values[-1])}" if len(values) > 1 else "")
            parts.append(f"{span} {noun}")
    return ", ".join(parts)


def _powers_of_two(low: float, high: float) -> list[int]:
    return [1 << e for e in range(math.ceil(math.log2(max(low, 1))), math.floor(math.log2(max(high, 1))) + 1)]


def _length_x_axis(ax, lengths) -> None:
    """A base-2 log x axis ticked at `lengths` (at powers of two when there are many), labelled
    128, 256, ..., 1k, 2k rather than 2^7."""
    ticker = require("matplotlib.ticker")
    ticks = sorted({int(n) for n in lengths if n >= 1})
    if len(ticks) > 10:
        powers = _powers_of_two(ticks[0], ticks[-1])
        ticks = powers[::-(-len(powers) // 10)]
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(ticker.FixedLocator(ticks))
    ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda value, _: length_label(value)))
    ax.xaxis.set_minor_locator(ticker.NullLocator())


def _plain_log_y_axis(ax) -> None:
    """A log y axis labelled 20, 30, 100, 2000 rather than 2x10^1."""
    ticker = require("matplotlib.ticker")
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(ticker.LogFormatter(labelOnlyBase=False))
    ax.yaxis.set_minor_formatter(ticker.LogFormatter(labelOnlyBase=False, minor_thresholds=(2, 0.5)))


def plot_perplexity_vs_length(methods: list[dict], path: str | Path, *, title: str) -> Path:
    """Perplexity against evaluation length (log-log), one line per method, with a dotted vertical
    line at each training length."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    train_lens = sorted({m["train_len"] for m in methods})
    for index, method in enumerate(methods):
        points = sorted((r["length"], r["perplexity"]) for r in method["perplexity"])
        ax.plot([p[0] for p in points], [p[1] for p in points], label=method["label"],
                **_line_style(index, method))
    for train_len in train_lens:
        ax.axvline(train_len, color="gray", linestyle=":", linewidth=1.2)
        ax.annotate(f"train {length_label(train_len)}", (train_len, 1.0),
                    xycoords=("data", "axes fraction"), xytext=(3, -12), textcoords="offset points",
                    fontsize=8, color="gray")
    _length_x_axis(ax, [r["length"] for m in methods for r in m["perplexity"]])
    _plain_log_y_axis(ax)
    ax.set_xlabel("evaluation length (tokens)")
    ax.set_ylabel("perplexity (sliding window; lower is better)")
    return _finish(plt, fig, ax, _titled(title, methods), path)


def _titled(title: str, methods: list[dict]) -> str:
    note = size_note(methods)
    return f"{title}\n{note}" if note else title


LEGEND_INSIDE_MAX = 8  # lines a legend inside the axes holds before it covers the curves


def _finish(plt, fig, ax, title: str, path: str | Path) -> Path:
    """Title, grid and legend of a line plot, then save it as PNG and close the figure."""
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    if len(ax.get_legend_handles_labels()[1]) > LEGEND_INSIDE_MAX:  # beside the axes: it covers no line
        fig.set_figwidth(fig.get_figwidth() + 3.5)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    else:
        ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_position_loss(methods: list[dict], path: str | Path, *, title: str) -> Path:
    """Mean loss by position inside the window at each method's longest evaluation length."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    all_centers = []
    for index, method in enumerate(methods):
        longest = max(method["perplexity"], key=lambda r: r["length"])
        centers = [(b["start"] + b["end"]) / 2 for b in longest["buckets"]]
        all_centers += centers
        ax.plot(centers, [b["loss"] for b in longest["buckets"]],
                label=f"{method['label']} (window {length_label(longest['length'])})",
                **_line_style(index, method))
    for train_len in sorted({m["train_len"] for m in methods}):
        ax.axvline(train_len, color="gray", linestyle=":", linewidth=1.2)
    _length_x_axis(ax, _powers_of_two(min(all_centers), max(all_centers)))
    ax.set_xlabel("position in the window (bucket centre, tokens)")
    ax.set_ylabel("mean loss (nats/token; lower is better)")
    return _finish(plt, fig, ax, _titled(title, methods), path)


def draw_passkey_heatmap(ax, grid: dict, *, title: str, ylabel: str = "key depth"):
    """Accuracy heat map on `ax`: key depth (rows) x context length (columns), each cell annotated;
    the image (for a colorbar). Any grid of `needle_grid` (passkey or retrieval task) draws the same."""
    lengths, depths = grid["lengths"], grid["depths"]
    accuracy = [[grid["accuracy"][li][di] for li in range(len(lengths))] for di in range(len(depths))]
    image = ax.imshow(accuracy, vmin=0.0, vmax=1.0, cmap="RdYlGn", aspect="auto")
    for di in range(len(depths)):
        for li in range(len(lengths)):
            ax.text(li, di, f"{accuracy[di][li]:.0%}", ha="center", va="center", fontsize=8)
    ax.set_xticks(range(len(lengths)), [length_label(n) for n in lengths])
    ax.set_yticks(range(len(depths)), [f"{d:.0%}" for d in depths])
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    return image


def plot_passkey_heatmap(grid: dict, path: str | Path, *, title: str) -> Path:
    """One accuracy heat map (draw_passkey_heatmap) in its own figure."""
    return plot_passkey_heatmaps([(grid, title)], path)


def plot_passkey_heatmaps(panels: list[tuple[dict, str]], path: str | Path, *, title: str = "",
                          columns: int = 3, ylabel: str = "key depth") -> Path:
    """Heat maps of several (grid, title) panels side by side, on one colour scale (a retrieval
    task's: one panel per method)."""
    plt = _pyplot()
    first = panels[0][0]
    cols = min(columns, len(panels))
    rows = -(-len(panels) // cols)
    width, height = 1.6 + 0.9 * len(first["lengths"]), 1.6 + 0.5 * len(first["depths"])
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False,
                             layout="constrained")
    for ax, (grid, panel_title) in zip(axes.flat, panels):
        image = draw_passkey_heatmap(ax, grid, title=panel_title, ylabel=ylabel)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.colorbar(image, ax=axes, shrink=min(1.0, 0.9 / rows ** 0.5))
    if title:
        fig.suptitle(title, fontsize=11)
    path = Path(path)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path
