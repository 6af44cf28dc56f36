"""Plots a reader can read: lengths as 128 ... 1k ... 16k, 'lower is better', the model size and
training tokens in the title, and one colour per method in every plot."""

import pytest

pytest.importorskip("matplotlib")

from tapa.eval import plots  # noqa: E402
from tapa.eval.report import write_results  # noqa: E402

LENGTHS = [128, 256, 512, 1024, 2048, 4096, 8192, 16384]


def method(label, offset, passkey=False):
    """A results.json method entry with made-up numbers (these tests draw, they measure nothing)."""
    buckets = [{"start": s, "end": 2 * s, "loss": 3.0 + offset} for s in (1, 4, 16, 64, 256, 1024, 4096)]
    entry = {"label": label, "train_len": 128, "zero_shot": True, "num_parameters": 1_234_567,
             "train_tokens": 2_048_000, "passkey": None,
             "perplexity": [{"length": n, "perplexity": 10.0 + offset + n / 1000, "buckets": buckets}
                            for n in LENGTHS]}
    if passkey:
        entry["passkey"] = {"lengths": [128, 1024, 2048], "depths": [0.0, 1.0], "trials": 1,
                            "filler": "standard", "accuracy": [[1.0, 1.0], [0.0, 1.0], [0.0, 0.0]]}
    return entry


@pytest.fixture
def figures(monkeypatch):
    """The figures the plot functions draw, kept open for inspection."""
    import matplotlib.pyplot as plt

    kept = []
    close = plt.close
    monkeypatch.setattr(plt, "close", kept.append)
    yield kept
    for figure in kept:
        close(figure)


def results(methods):
    return {"kind": "tapa-eval", "date": "2026-01-01", "hardware": "cpu", "command": "tapa eval x",
            "split": "test", "stride": 256, "max_tokens": 8192, "methods": methods}


def test_axes_titles_and_colours(tmp_path, figures):
    first = [method("RoPE", 0), method("RoPE+YaRN", 1), method("TAPA", 2, passkey=True)]
    write_results(results(first), tmp_path / "a", title="demo")
    second = [method("TAPA", 0), method("TAPA hybrid (LLLG, w256)", 1), method("NoPE", 2), method("RoPE", 3)]
    write_results(results(second), tmp_path / "b", title="other")
    perplexity, position, passkey = figures[0].axes[0], figures[1].axes[0], figures[2].axes[0]
    for figure in figures:
        figure.canvas.draw()

    ticks = [t.get_text() for t in perplexity.get_xticklabels()]
    assert ticks == ["128", "256", "512", "1k", "2k", "4k", "8k", "16k"]
    assert all("^" not in t.get_text() for t in position.get_xticklabels() + perplexity.get_yticklabels())
    assert [t.get_text() for t in passkey.get_xticklabels()] == ["128", "1k", "2k"]
    assert "lower is better" in perplexity.get_ylabel() and "lower is better" in position.get_ylabel()
    for axes in (perplexity, position, passkey):
        assert "1.23M parameters, 2.05M training tokens" in axes.get_title()

    colours = {}
    for figure in figures:
        for axes in figure.axes:
            for line in axes.get_lines():
                label = line.get_label().split(" (window")[0]
                if not label.startswith("_"):
                    colours.setdefault(label, set()).add(line.get_color())
    assert all(len(found) == 1 for found in colours.values()), colours
    assert colours["RoPE"] == {plots.METHOD_COLORS["RoPE"]}
    assert colours["TAPA"] == {plots.METHOD_COLORS["TAPA"]}
    assert colours["TAPA hybrid (LLLG, w256)"] == {plots.METHOD_COLORS["TAPA hybrid"]}
    assert colours["RoPE+YaRN"] == {plots.METHOD_COLORS["YaRN"]}
    assert len({next(iter(c)) for c in colours.values()}) == len(colours)  # one method, one colour


def test_colour_of_unknown_and_merged_labels_is_fixed():
    assert plots.method_color("run-a: TAPA") == plots.METHOD_COLORS["TAPA"]
    unknown = plots.method_color("ALiBi")
    assert unknown == plots.method_color("ALiBi") and unknown not in plots.METHOD_COLORS.values()
    assert plots.length_label(1536) == "1.5k" and plots.length_label(1000) == "1000"
    assert plots.size_note([{"num_parameters": 30_000_000}, {"num_parameters": 31_500_000}]) == \
        "30M-31.5M parameters"
    assert plots.size_note([{"label": "x"}]) == ""


def test_rewriting_results_drops_an_old_passkey_plot(tmp_path, figures):
    write_results(results([method("TAPA", 0, passkey=True)]), tmp_path)
    assert (tmp_path / "passkey_tapa.png").is_file()
    write_results(results([method("TAPA", 0)]), tmp_path)
    assert not (tmp_path / "passkey_tapa.png").exists()


def test_a_long_legend_goes_beside_the_axes(tmp_path, figures):
    """Up to LEGEND_INSIDE_MAX methods the legend sits inside the axes; more would cover the curves
    (a report of 15 arms did), so the figure widens and the legend goes to the right of the axes."""
    for count, outside in ((plots.LEGEND_INSIDE_MAX, False), (plots.LEGEND_INSIDE_MAX + 1, True)):
        plots.plot_perplexity_vs_length([method(f"m{i}", i) for i in range(count)],
                                        tmp_path / f"{count}.png", title="t")
        figure = figures[-1]
        anchor = figure.axes[0].get_legend().get_bbox_to_anchor().transformed(
            figure.axes[0].transAxes.inverted())
        assert bool(anchor.x0 > 1.0) is outside, (count, anchor)
        assert bool(figure.get_figwidth() > 7.5) is outside
