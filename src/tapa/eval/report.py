"""Tables and files for evaluation results, and `tapa report RUN_DIR...`, which merges evaluated
runs into one comparison (results.json, results.md, perplexity.png, passkey and retrieval-task heat
maps in --out). A run evaluated with --data is merged from its RUN_DIR/eval-<name> directory."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tapa._paths import check_output_dir, replacing_outputs
from tapa.eval.plots import (plot_passkey_heatmap, plot_passkey_heatmaps, plot_perplexity_vs_length,
                             plot_position_loss, size_note)
from tapa.eval.tasks import SEVERAL_ITEMS, TASKS, beyond_window, wilson_interval

RESULTS_JSON = "results.json"
# everything write_results writes (fnmatch patterns); results.json marks a directory as its own
RESULT_FILES = (RESULTS_JSON, "results.md", "perplexity.png", "position_loss.png", "passkey_*.png",
                "retrieval_*.png")
DEFAULT_REPORT_DIR = "runs/report"


def check_results_dir(out_dir: str | Path, *, overwrite: bool, command: str) -> Path:
    """The output-directory rule of tapa._paths for write_results' files (call before the work)."""
    return check_output_dir(out_dir, outputs=RESULT_FILES, marker=RESULTS_JSON, overwrite=overwrite,
                            command=command)


def _format_ppl(value: float) -> str:
    if value != value or value == float("inf"):
        return str(value)
    return f"{value:.2f}" if value < 1000 else f"{value:.0f}"


def _slug(label: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in label.lower()).strip("-")


def perplexity_table(methods: list[dict]) -> str:
    """Markdown: one row per method, one column per evaluation length (with the multiple of the
    training length when all methods share one; else a 'trained at' column). Merged zero-shot and
    continual runs get a 'stage' column."""
    lengths = sorted({r["length"] for m in methods for r in m["perplexity"]})
    train_lens = {m["train_len"] for m in methods}
    shared = next(iter(train_lens)) if len(train_lens) == 1 else None

    def header(length):
        return f"{length} ({length / shared:g}x)" if shared else str(length)

    # runs of mixed training lengths or stages get columns saying which is which
    extra = []
    if shared is None:
        extra.append(("trained at", lambda m: str(m["train_len"])))
    if len({m["zero_shot"] for m in methods}) > 1:
        extra.append(("stage", lambda m: "zero-shot" if m["zero_shot"] else "continual"))
    lines = ["| method | " + "".join(f"{name} | " for name, _ in extra)
             + " | ".join(header(n) for n in lengths) + " |",
             "|---|" + "---|" * (len(extra) + len(lengths))]
    for method in methods:
        by_length = {r["length"]: r["perplexity"] for r in method["perplexity"]}
        cells = [value(method) for _, value in extra]
        cells += [_format_ppl(by_length[n]) if n in by_length else "" for n in lengths]
        lines.append(f"| {method['label']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def growth_summary(methods: list[dict]) -> str:
    """One line: each method's perplexity at its longest length over its perplexity at the
    training length (how much it degrades past the training length)."""
    parts = []
    for method in methods:
        by_length = {r["length"]: r["perplexity"] for r in method["perplexity"]}
        longest = max(by_length)
        if method["train_len"] in by_length and longest > method["train_len"]:
            ratio = by_length[longest] / by_length[method["train_len"]]
            parts.append(f"{method['label']} {ratio:.2f}x")
    if not parts:
        return ""
    return ("Perplexity at the longest length over perplexity at the training length: "
            + ", ".join(parts) + ".")


def position_table(methods: list[dict]) -> str:
    """Markdown: mean loss by window-position bucket at each method's longest length."""
    lines = []
    for method in methods:
        longest = max(method["perplexity"], key=lambda r: r["length"])
        if not lines:
            spans = [f"{b['start']}-{b['end']}" for b in longest["buckets"]]
            lines = ["| method (window) | " + " | ".join(spans) + " |", "|---|" + "---|" * len(spans)]
        cells = [f"{b['loss']:.3f}" for b in longest["buckets"]]
        lines.append(f"| {method['label']} ({longest['length']}) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _correct_counts(grid: dict) -> list[list[int]]:
    """Right answers per [length][depth] (grids of older results hold only the accuracy)."""
    if grid.get("correct"):
        return grid["correct"]
    return [[int(round(a * grid["trials"])) for a in row] for row in grid["accuracy"]]


def _with_interval(correct: int, n: int) -> str:
    low, high = wilson_interval(correct, n)
    return f"{correct / n:.0%} ({100 * low:.0f}-{100 * high:.0f})"


def local_window(method: dict) -> int:
    """The local attention window in tokens of a method (or of a model config as a dict, which has
    the same keys); 0 for a model without local layers."""
    return int(method.get("local_window") or 0) if "L" in (method.get("layer_pattern") or "") else 0


def grid_table(label: str, grid: dict, *, what: str = "", window: int = 0) -> str:
    """Markdown of a passkey or task grid: a row per depth, a column per length, each cell the
    accuracy and its 95% Wilson interval in points, a row over all depths of a length, and, for a
    model with local layers of `window` tokens, a row over the depths whose needle lies beyond the
    window (`beyond_window`), what only the global layers retrieve (empty where none does)."""
    counts, trials = _correct_counts(grid), grid["trials"]
    settings = ", ".join(f"{k} {v}" for k, v in (grid.get("settings") or {}).items())
    lines = [f"**{label}**{f' {what}' if what else ''} ({trials} trial{'s' * (trials != 1)} per cell, "
             f"{grid['filler']} filler"
             f"{', ' + settings if settings else ''})", "",
             "| depth | " + " | ".join(str(n) for n in grid["lengths"]) + " |",
             "|---|" + "---|" * len(grid["lengths"])]
    for di, depth in enumerate(grid["depths"]):
        cells = [_with_interval(counts[li][di], trials) for li in range(len(grid["lengths"]))]
        lines.append(f"| {depth:.0%} | " + " | ".join(cells) + " |")
    if len(grid["depths"]) > 1:
        cells = [_with_interval(sum(counts[li]), trials * len(grid["depths"]))
                 for li in range(len(grid["lengths"]))]
        lines.append("| all depths | " + " | ".join(cells) + " |")
    # per length, the depths whose needle lies beyond the window (a row only where that splits them)
    far = [[di for di, depth in enumerate(grid["depths"]) if beyond_window(n, depth, window)]
           for n in grid["lengths"]] if window > 0 else []
    far_row = any(0 < len(ds) < len(grid["depths"]) for ds in far)
    if far_row:
        cells = [_with_interval(sum(counts[li][di] for di in ds), trials * len(ds)) if ds else ""
                 for li, ds in enumerate(far)]
        lines.append(f"| beyond the {window}-token window | " + " | ".join(cells) + " |")
    if grid.get("recall") and grid.get("task") in SEVERAL_ITEMS:
        # the mean item recall (tapa.eval.tasks.judge_task): partial credit where exact answers fail
        mean = lambda li, ds: f"{sum(grid['recall'][li][di] for di in ds) / len(ds):.0%}" if ds else ""
        every = [list(range(len(grid["depths"])))] * len(grid["lengths"])
        lines.append("| item recall, all depths | " + " | ".join(mean(li, ds) for li, ds in enumerate(every)) + " |")
        if far_row:
            lines.append(f"| item recall, beyond the {window}-token window | "
                         + " | ".join(mean(li, ds) for li, ds in enumerate(far)) + " |")
    return "\n".join(lines)


def passkey_table(label: str, grid: dict, window: int = 0) -> str:
    return grid_table(label, grid, window=window)


def _task_names(methods: list[dict]) -> list[str]:
    found = {task for m in methods for task in (m.get("tasks") or {})}
    return [task for task in TASKS if task in found] + sorted(found - set(TASKS))


def task_tables(methods: list[dict]) -> str:
    """Markdown tables of every retrieval task grid of `methods` ('' when there is none)."""
    parts = []
    for task in _task_names(methods):
        parts += [f"### {task}", ""]
        for method in methods:
            grid = (method.get("tasks") or {}).get(task)
            if grid:
                parts += [grid_table(method["label"], grid, window=local_window(method)), ""]
    return "\n".join(parts).rstrip()


def data_phrase(results: dict) -> str:
    """What text the numbers come from, for the report's first paragraph."""
    data = results.get("data")
    if data == "mixed":
        return "several texts (the runs were evaluated on different data; see each run's results)"
    if not data:
        return f"the {results['split']} split"
    if data.get("run_corpus"):
        return f"the {data['split']} split of the run's corpus ({data['source']}, {data['tokens']:,} tokens)"
    part = "all of it" if data["split"] == "all" else f"its {data['split']} split"
    return f"`{data['source']}` ({part}, {data['tokens']:,} tokens with the run's own tokenizer)"


def results_markdown(results: dict) -> str:
    methods = results["methods"]
    train_lens = sorted({m["train_len"] for m in methods})
    zero_shot = all(m["zero_shot"] for m in methods)
    cap = (f"at most {results['max_tokens']} scored tokens per length" if results.get("max_tokens")
           else "all tokens")
    variant_note = (" RoPE+X: the RoPE model's weights evaluated with scaling rule X set for each length "
                    "(no fine-tuning)." if any("+" in m["label"] for m in methods) else "")
    parts = [
        "## Perplexity vs evaluation length", "",
        f"Data: {data_phrase(results)}.", "",
        f"Sliding-window perplexity (stride {results['stride']}, only new tokens scored), {cap}. "
        f"Training length: {', '.join(map(str, train_lens))} tokens"
        f"{'; zero-shot (no continual stage)' if zero_shot else ''}." + variant_note, "",
        perplexity_table(methods), "", growth_summary(methods), "",
        "## Loss by position inside the window (longest length)", "",
        position_table(methods), ""]
    grids = [(m["label"], m["passkey"], local_window(m)) for m in methods if m.get("passkey")]
    interval_note = ("Cells: exact-match accuracy (95% Wilson interval, in points); \"all depths\" pools "
                     "every depth of a length, and for a hybrid model \"beyond the window\" pools the "
                     "depths whose needle lies farther back than its local layers reach, the retrieval "
                     "that only its global layers can do.")
    if grids:
        parts += ["## Passkey retrieval (exact-match accuracy)", "", interval_note, ""]
        for label, grid, window in grids:
            parts += [passkey_table(label, grid, window), ""]
    tables = task_tables(methods)
    if tables:
        parts += ["## Retrieval tasks (exact-match accuracy)", "",
                  interval_note + " Rows: depth of the asked needle; columns: context length (tokens). "
                  f"For {' and '.join(SEVERAL_ITEMS)}, whose answer lists several items, \"item recall\" "
                  "is the mean share of the expected items the answer names (RULER's score for them), "
                  "which gives partial credit where exact answers fail.", "",
                  tables, ""]
    parts += [f"Command: `{results['command']}`  ", f"Hardware: {results['hardware']}  ",
              f"Date: {results['date']}", ""]
    return "\n".join(parts)


def write_results(results: dict, out_dir: str | Path, *, title: str = "") -> list[Path]:
    """results.json, results.md, perplexity.png, position_loss.png and a passkey heat map per
    method with a passkey grid, in out_dir; files of an earlier call there that this one does not
    write (a passkey plot) are removed. Returns the paths written."""
    methods = results["methods"]
    if not methods:
        raise ValueError("results hold no methods to report")
    with replacing_outputs(out_dir, RESULT_FILES) as out_dir:
        written = [out_dir / RESULTS_JSON, out_dir / "results.md"]
        written[0].write_text(json.dumps(results, indent=2))
        written[1].write_text(results_markdown(results))
        title = title or "perplexity vs evaluation length"
        written.append(plot_perplexity_vs_length(methods, out_dir / "perplexity.png", title=title))
        written.append(plot_position_loss(methods, out_dir / "position_loss.png",
                                          title="loss by position inside the longest window"))
        for method in methods:
            if method.get("passkey"):
                path = out_dir / f"passkey_{_slug(method['label'])}.png"
                note = size_note([method])
                written.append(plot_passkey_heatmap(
                    method["passkey"], path,
                    title=f"passkey retrieval: {method['label']}" + (f"\n{note}" if note else "")))
        for task in _task_names(methods):
            panels = [(m["tasks"][task], m["label"]) for m in methods if (m.get("tasks") or {}).get(task)]
            trials = sorted({grid["trials"] for grid, _ in panels})
            note = size_note([m for m in methods if (m.get("tasks") or {}).get(task)])
            written.append(plot_passkey_heatmaps(
                panels, out_dir / f"retrieval_{_slug(task)}.png", ylabel="needle depth",
                title=f"{task}: exact-match accuracy ({'/'.join(map(str, trials))} "
                      f"trial{'s' * (trials != [1])} per cell)"
                      + (f"\n{note}" if note else "")))
    return written


def load_results(path: str | Path) -> dict:
    """results.json of an evaluated run: a run dir (RUN/eval/results.json, else its one
    RUN/eval-<data>/results.json of `tapa eval --data`), a directory holding results.json, or the
    file itself."""
    path = Path(path)
    on_data = sorted(path.glob(f"eval-*/{RESULTS_JSON}")) if path.is_dir() else []
    if len(on_data) > 1 and not (path / "eval" / RESULTS_JSON).is_file() and not (path / RESULTS_JSON).is_file():
        listing = ", ".join(str(file.parent) for file in on_data)
        raise ValueError(f"{str(path)!r} was evaluated on {len(on_data)} texts ({listing}); pass the "
                         "folder of the one to compare")
    for candidate in (path / "eval" / RESULTS_JSON, path / RESULTS_JSON, *on_data, path):
        if candidate.is_file():
            try:
                results = json.loads(candidate.read_text())
            except json.JSONDecodeError as err:
                raise ValueError(f"{str(candidate)!r} is not valid JSON ({err}); rerun 'tapa eval'") from err
            if not isinstance(results, dict) or results.get("kind") != "tapa-eval":
                raise ValueError(f"{str(candidate)!r} is not a tapa eval results file")
            return results
    raise ValueError(f"no evaluation results under {str(path)!r}: run 'tapa eval {path}' first")


def _comparable(key: str, value):
    """What must agree between merged runs: the data by the token ids scored (their digest, where
    recorded), not by where each run's cache or tokenizer file lies."""
    if key == "data" and isinstance(value, dict) and value.get("token_sha256"):
        return (value.get("source"), value.get("split"), value["token_sha256"])
    return value


def merge_results(all_results: list[dict], *, command: str = "") -> dict:
    """One results dict with every method of every run; labels get the run name when they clash."""
    if not all_results:
        raise ValueError("nothing to merge")
    methods = [dict(m) for results in all_results for m in results["methods"]]
    labels = [m["label"] for m in methods]
    for method in methods:
        if labels.count(method["label"]) > 1 and method.get("run"):
            method["label"] = f"{method['run']}: {method['label']}"
    first = all_results[0]
    same = {key: first.get(key) if all(_comparable(key, r.get(key)) == _comparable(key, first.get(key))
                                       for r in all_results) else "mixed"
            for key in ("split", "stride", "max_tokens", "hardware", "data")}
    return {"kind": "tapa-eval", "date": max(r["date"] for r in all_results), "command": command,
            "source_commands": [r["command"] for r in all_results], **same,
            "runs": [run for r in all_results for run in r.get("runs", [])], "methods": methods}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR",
                        help="evaluated run directories (or results.json files) to compare")
    parser.add_argument("--out", default=DEFAULT_REPORT_DIR,
                        help="output directory (default: %(default)s)")
    parser.add_argument("--overwrite", action="store_true",
                        help="write into --out even if it holds files tapa report did not write")
    parser.add_argument("--title", default="", help="plot title")


def run(args: argparse.Namespace) -> int:
    check_results_dir(args.out, overwrite=args.overwrite, command="tapa report")
    command = " ".join(["tapa report", *map(str, args.runs), "--out", str(args.out)])
    merged = merge_results([load_results(path) for path in args.runs], command=command)
    written = write_results(merged, args.out, title=args.title or "perplexity vs evaluation length")
    print(perplexity_table(merged["methods"]))
    print("\nwrote " + ", ".join(str(p) for p in written))
    return 0
