"""PNG plots of evaluation results: perplexity vs length, loss by window position, passkey heat maps.

Every function takes the plain dicts that `tapa eval` writes to results.json (see
`tapa.eval.evaluate`), so `tapa report` can redraw merged runs without the models.
"""

from __future__ import annotations

from pathlib import Path

from tapa._optional import require


def _pyplot():
    matplotlib = require("matplotlib")
    matplotlib.use("Agg")  # files only; never needs a display
    import matplotlib.pyplot as plt

    return plt


_MARKERS = ("o", "s", "^", "v", "D", "P", "X", "*")


def _line_style(index: int, method: dict) -> dict:
    """Distinct markers, so coinciding curves stay visible; eval-time variants (RoPE+X) dashed
    with hollow markers."""
    variant = "+" in method["label"]
    style = {"marker": _MARKERS[index % len(_MARKERS)], "markersize": 9 - 1.5 * (index % 4),
             "linestyle": "--" if variant else "-"}
    if variant:
        style["markerfacecolor"] = "none"
    return style


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
        ax.annotate(f"train {train_len}", (train_len, 1.0), xycoords=("data", "axes fraction"),
                    xytext=(3, -12), textcoords="offset points", fontsize=8, color="gray")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("evaluation length (tokens)")
    ax.set_ylabel("perplexity (sliding window)")
    return _finish(plt, fig, ax, title, path)


def _finish(plt, fig, ax, title: str, path: str | Path) -> Path:
    """Title, grid and legend of a line plot, then save it as PNG and close the figure."""
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
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
    for index, method in enumerate(methods):
        longest = max(method["perplexity"], key=lambda r: r["length"])
        centers = [(b["start"] + b["end"]) / 2 for b in longest["buckets"]]
        ax.plot(centers, [b["loss"] for b in longest["buckets"]],
                label=f"{method['label']} (window {longest['length']})", **_line_style(index, method))
    for train_len in sorted({m["train_len"] for m in methods}):
        ax.axvline(train_len, color="gray", linestyle=":", linewidth=1.2)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("position in the window (bucket centre, tokens)")
    ax.set_ylabel("mean loss (nats/token)")
    return _finish(plt, fig, ax, title, path)


def plot_passkey_heatmap(grid: dict, path: str | Path, *, title: str) -> Path:
    """Accuracy heat map: key depth (rows) x context length (columns), each cell annotated."""
    plt = _pyplot()
    lengths, depths = grid["lengths"], grid["depths"]
    accuracy = [[grid["accuracy"][li][di] for li in range(len(lengths))] for di in range(len(depths))]
    fig, ax = plt.subplots(figsize=(1.2 + 0.9 * len(lengths), 1.2 + 0.5 * len(depths)))
    image = ax.imshow(accuracy, vmin=0.0, vmax=1.0, cmap="RdYlGn", aspect="auto")
    for di in range(len(depths)):
        for li in range(len(lengths)):
            ax.text(li, di, f"{accuracy[di][li]:.0%}", ha="center", va="center", fontsize=8)
    ax.set_xticks(range(len(lengths)), [str(n) for n in lengths])
    ax.set_yticks(range(len(depths)), [f"{d:.0%}" for d in depths])
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("key depth")
    ax.set_title(title, fontsize=10)
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
