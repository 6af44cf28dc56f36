"""Associative recall at CPU scale: can a hybrid's global layers retrieve past the training length,
and does TAPA or NoPE in them retrieve better?

The globals pilot (results/toy-study/globals/cpu-pilot) measures perplexity only: its 1.1M-parameter
language models never learned passkey retrieval. This pilot trains the same kind of hybrid on a
synthetic multi-query associative recall task instead, which models this small do learn, so the
question "what do the global layers add to retrieval" gets a CPU-scale answer.

A sequence of T tokens: random filler, a block of P key-value pairs at a random offset, more filler,
then the P keys again in a shuffled order, each followed by its value. The loss and the accuracy
count the value predicted after each repeated key (P targets a sequence). Keys, values and filler
have disjoint vocabularies, so the only way to the answer is to find the key's earlier occurrence
and read the token after it: a local layer can carry "my previous token" into each position, and a
global layer must then match it at any distance. Trained at T = train_len; evaluated at longer T,
where the pairs sit farther from their queries than anything seen in training.

    python3 -m lab.study.recall_pilot --arms hybrid-tapa hybrid-nope --seeds 0 --out /tmp/recall
    python3 -m lab.study.recall_pilot --table /tmp/recall --plot recall.png > summary.md
    python3 -m lab.study.recall_pilot --windows /tmp/recall /tmp/recall-w8 --seeds 0 1 2 --plot windows.png
        (the local-window lever: the runs of several --window values side by side)
    python3 -m lab.study.recall_pilot --levers /tmp/recall /tmp/recall-levers --seeds 0 1 2 --plot levers.png
        (the other levers: each against its reference arm seed by seed, TAPA against NoPE per lever)

Each (arm, seed) writes OUT/ARM-sSEED.json and is skipped when that file exists.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch

from lab.study.aggregate import save_png
from tapa.eval.stats import mann_whitney_exact
from tapa.model import ModelConfig, TapaLM
from tapa.train.config import TrainConfig
from tapa.train.trainer import lr_at, make_optimizer, set_lr

N_KEYS = N_VALUES = 64
N_FILLER = 128
KEY0, VALUE0, FILLER0 = 0, N_KEYS, N_KEYS + N_VALUES
VOCAB = N_KEYS + N_VALUES + N_FILLER

# TAPA's phase rows started at 0 and never trained: cos = 1 at every distance (the diagnosis arms)
FROZEN_PHASE = {"phase_init_scale": 0.0, "phase_lr_scale": 0.0}
# Arms: (layer pattern, global pe, extra ModelConfig fields). An arm has one layer per code of its
# pattern: 4 (LLLG) but for the ratio levers' 6, whose two patterns share a depth (Setup: dim, heads).
ARMS = {
    "hybrid-tapa": ("LLLG", "tapa", {}),
    "hybrid-nope": ("LLLG", "nope", {}),
    "hybrid-rope": ("LLLG", "rope", {}),
    "hybrid-tapa-theta25": ("LLLG", "tapa", {"theta": 0.25}),
    "hybrid-tapa-theta75": ("LLLG", "tapa", {"theta": 0.75}),
    "hybrid-tapa-alpha05": ("LLLG", "tapa", {"alpha": 0.05}),
    "hybrid-tapa-alpha2": ("LLLG", "tapa", {"alpha": 0.2}),
    "hybrid-tapa-temp": ("LLLG", "tapa", {"query_temperature_base": "train_len"}),
    "hybrid-nope-temp": ("LLLG", "nope", {"query_temperature_base": "train_len"}),
    "hybrid-tapa-llg": ("LLGLLG", "tapa", {}),
    "hybrid-nope-llg": ("LLGLLG", "nope", {}),
    "hybrid-tapa-l5g": ("LLLLLG", "tapa", {}),
    "hybrid-nope-l5g": ("LLLLLG", "nope", {}),
    # a diagnosis: TAPA globals whose phase rows start at 0 and never train (cos = 1 at every
    # distance), i.e. NoPE scored on the amplitude part's head_dim / 2 dims only
    "hybrid-tapa-nophase": ("LLLG", "tapa", FROZEN_PHASE),
    # the same diagnosis at the LLG ratio: does TAPA's lead over NoPE there come from the phase?
    "hybrid-tapa-nophase-llg": ("LLGLLG", "tapa", FROZEN_PHASE),
    # the two levers that each helped TAPA on the GPU screen's seed 0, together
    "hybrid-tapa-theta75-llg": ("LLGLLG", "tapa", {"theta": 0.75}),
}
LABELS = {
    "hybrid-tapa": "TAPA globals (theta 0.5)",
    "hybrid-nope": "NoPE globals",
    "hybrid-rope": "RoPE globals (no scaling)",
    "hybrid-tapa-theta25": "TAPA globals, theta 0.25",
    "hybrid-tapa-theta75": "TAPA globals, theta 0.75",
    "hybrid-tapa-alpha05": "TAPA globals, alpha 0.05",
    "hybrid-tapa-alpha2": "TAPA globals, alpha 0.2",
    "hybrid-tapa-temp": "TAPA globals, query temperature",
    "hybrid-nope-temp": "NoPE globals, query temperature",
    "hybrid-tapa-llg": "TAPA globals, LLG ratio (LLGLLG)",
    "hybrid-nope-llg": "NoPE globals, LLG ratio (LLGLLG)",
    "hybrid-tapa-l5g": "TAPA globals, LLLLLG ratio",
    "hybrid-nope-l5g": "NoPE globals, LLLLLG ratio",
    "hybrid-tapa-nophase": "TAPA globals, phase rows frozen at 0",
    "hybrid-tapa-nophase-llg": "TAPA globals, LLG ratio, phase rows frozen at 0",
    "hybrid-tapa-theta75-llg": "TAPA globals, LLG ratio, theta 0.75",
}


@dataclasses.dataclass
class Setup:
    train_len: int = 64
    pairs: int = 8
    window: int = 16
    dim: int = 128
    heads: int = 4
    steps: int = 3000
    batch: int = 32
    lr: float = 3e-3
    warmup: int = 100
    eval_lens: tuple[int, ...] = (64, 128, 256, 512, 1024, 2048)
    eval_seqs: int = 64
    eval_batch: int = 16


def make_batch(n: int, length: int, pairs: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor,
                                                                            torch.Tensor]:
    """(inputs, targets, pair offsets): inputs (n, length) token ids, targets -100 except the value
    after each repeated key, and each sequence's pair-block offset (the depth)."""
    if length < 4 * pairs + 1:
        raise ValueError(f"length {length} holds no {pairs} pairs and their queries")
    seq = FILLER0 + torch.randint(0, N_FILLER, (n, length + 1), generator=gen)
    keys = KEY0 + torch.argsort(torch.rand(n, N_KEYS, generator=gen), dim=1)[:, :pairs]
    values = VALUE0 + torch.randint(0, N_VALUES, (n, pairs), generator=gen)
    query_start = length + 1 - 2 * pairs
    offsets = torch.randint(0, query_start - 2 * pairs + 1, (n,), generator=gen)
    rows = torch.arange(n)[:, None]
    slots = offsets[:, None] + 2 * torch.arange(pairs)
    seq[rows, slots], seq[rows, slots + 1] = keys, values
    order = torch.argsort(torch.rand(n, pairs, generator=gen), dim=1)
    qslots = query_start + 2 * torch.arange(pairs)
    seq[rows, qslots] = keys.gather(1, order)
    seq[rows, qslots + 1] = values.gather(1, order)
    inputs, targets = seq[:, :-1], torch.full((n, length), -100)
    targets[rows, qslots] = seq[rows, qslots + 1]
    return inputs, targets, offsets


def model_config(arm: str, setup: Setup) -> ModelConfig:
    pattern, pe, extra = ARMS[arm]
    extra = {k: setup.train_len if v == "train_len" else v for k, v in extra.items()
             if k != "phase_lr_scale"}
    extra.setdefault("phase_init_scale", 0.1)
    return ModelConfig(vocab_size=VOCAB, dim=setup.dim, n_layers=len(pattern), n_heads=setup.heads, pe=pe,
                       layer_pattern=pattern, local_window=setup.window, attn_impl="reference",
                       **extra)


@torch.no_grad()
def accuracy(model: TapaLM, length: int, setup: Setup, seed: int) -> dict:
    gen = torch.Generator().manual_seed(10_000 + seed * 100 + int(math.log2(length)))
    right = total = 0
    by_depth = [[0, 0] for _ in range(4)]
    for start in range(0, setup.eval_seqs, setup.eval_batch):
        n = min(setup.eval_batch, setup.eval_seqs - start)
        inputs, targets, offsets = make_batch(n, length, setup.pairs, gen)
        logits = model(inputs)
        mask = targets >= 0
        hit = (logits.argmax(-1) == targets) & mask
        right += int(hit.sum())
        total += int(mask.sum())
        span = length - 4 * setup.pairs + 1
        for row in range(n):
            bucket = min(3, int(4 * int(offsets[row]) / span))
            by_depth[bucket][0] += int(hit[row].sum())
            by_depth[bucket][1] += int(mask[row].sum())
    return {"length": length, "accuracy": right / total, "queries": total,
            "by_depth": [r / t if t else None for r, t in by_depth]}


def run_arm(arm: str, seed: int, setup: Setup, out: Path, progress: bool) -> dict:
    torch.manual_seed(seed)
    cfg = model_config(arm, setup)
    model = TapaLM(cfg)
    train_cfg = TrainConfig(lr=setup.lr, steps=setup.steps, warmup_steps=setup.warmup,
                            phase_lr_scale=ARMS[arm][2].get("phase_lr_scale", 0.1))
    optimizer = make_optimizer(model, train_cfg)
    gen = torch.Generator().manual_seed(seed)
    start = time.time()
    losses = []
    for step in range(setup.steps):
        set_lr(optimizer, lr_at(step, train_cfg))
        inputs, targets, _ = make_batch(setup.batch, setup.train_len, setup.pairs, gen)
        loss = model.loss(inputs, targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), train_cfg.grad_clip)
        optimizer.step()
        losses.append(loss.item())
        if progress and (step + 1) % 100 == 0:
            print(f"  {arm} seed {seed} step {step + 1}: loss {sum(losses[-100:]) / 100:.3f} "
                  f"({time.time() - start:.0f} s)", file=sys.stderr, flush=True)
    train_s = time.time() - start
    model.eval()
    evals = [accuracy(model, length, setup, seed) for length in setup.eval_lens]
    result = {"arm": arm, "seed": seed, "setup": dataclasses.asdict(setup), "config": cfg.label,
              "parameters": model.num_parameters(), "train_s": round(train_s, 1),
              "eval_s": round(time.time() - start - train_s, 1),
              "final_loss": sum(losses[-100:]) / min(100, len(losses)),
              "loss_curve": [round(sum(losses[i:i + 50]) / len(losses[i:i + 50]), 4)
                             for i in range(0, len(losses), 50)],
              "evals": evals}
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{arm}-s{seed}.json"
    path.with_suffix(".tmp").write_text(json.dumps(result, indent=1))
    path.with_suffix(".tmp").replace(path)
    return result


def load_results(folder: Path) -> dict[str, list[dict]]:
    """{arm: its runs' results} of a finished OUT (SystemExit if it has none)."""
    results: dict[str, list[dict]] = {}
    for path in sorted(folder.glob("*-s*.json")):
        data = json.loads(path.read_text())
        results.setdefault(data["arm"], []).append(data)
    if not results:
        raise SystemExit(f"recall_pilot: no results in {folder}")
    return results


def mean_recall(run: dict) -> float:
    """A run's recall in %, the mean over its evaluation lengths."""
    return 100 * sum(e["accuracy"] for e in run["evals"]) / len(run["evals"])


def spread_test(a: list[float], b: list[float]) -> tuple[float, float, float]:
    """Whether two arms' seeds spread alike (a Brown-Forsythe permutation test): each value's
    absolute deviation from its own arm's median, and the difference of the two arms' mean
    deviations, against every split of the pooled deviations into groups of len(a) and len(b).
    Returns (mean deviation of a, of b, two-sided p)."""
    if len(a) < 2 or len(b) < 2:
        raise ValueError(f"need 2+ values a side, got {len(a)} and {len(b)}")
    da = [abs(x - statistics.median(a)) for x in a]
    db = [abs(x - statistics.median(b)) for x in b]
    pooled, total = da + db, sum(da) + sum(db)
    observed = abs(sum(da) / len(da) - sum(db) / len(db))
    extreme = count = 0
    for picked in itertools.combinations(range(len(pooled)), len(da)):
        first = sum(pooled[i] for i in picked)
        count += 1
        extreme += abs(first / len(da) - (total - first) / len(db)) >= observed - 1e-12
    return sum(da) / len(da), sum(db) / len(db), extreme / count


def spread_lines(results: dict[str, list[dict]]) -> list[str]:
    """Each TAPA-global arm against NoPE globals, where both have 4+ seeds: every seed's recall
    (mean over the evaluation lengths), the mean absolute deviation from the arm's median, and
    spread_test's p."""
    if len(results.get("hybrid-nope", [])) < 4:
        return []
    nope = [mean_recall(r) for r in sorted(results["hybrid-nope"], key=lambda r: r["seed"])]
    rows = []
    for arm in [a for a in ARMS if a in results and a != "hybrid-nope" and len(results[a]) >= 4]:
        runs = sorted(results[arm], key=lambda r: r["seed"])
        values = [mean_recall(r) for r in runs]
        dev, dev_nope, p = spread_test(values, nope)
        rows.append(f"| {LABELS[arm]} | {len(runs)} against {len(nope)} | "
                    f"{' / '.join(f'{v:.0f}' for v in values)} | {dev:.1f} | {dev_nope:.1f} | {p:.3f} |")
    if not rows:
        return []
    dev_nope = sum(abs(v - statistics.median(nope)) for v in nope) / len(nope)
    return ["", "Seed spread (each seed's recall, mean over the lengths; mean absolute deviation "
            "from the arm's median; two-sided permutation p that the two arms spread alike):", "",
            "| arm | seeds | recall by seed | deviation | NoPE's deviation | p |", "|---|---|---|---|---|---|",
            *rows, f"| {LABELS['hybrid-nope']} | {len(nope)} | {' / '.join(f'{v:.0f}' for v in nope)} | "
            f"{dev_nope:.1f} | | |"]


def _lengths(runs_by_key: dict) -> list[int]:
    """The evaluation lengths of a set of runs (the first run's: the loaders refuse a mix)."""
    return next(iter(runs_by_key.values()))[0]["setup"]["eval_lens"]


def _length_labels(runs_by_key: dict) -> list[str]:
    """Column headers for the evaluation lengths, each with its multiple of the training length:
    "64 (1x)", "128 (2x)", ..."""
    train_len = next(iter(runs_by_key.values()))[0]["setup"]["train_len"]
    return [f"{n} ({n // train_len}x)" for n in _lengths(runs_by_key)]


def _length_cells(runs: list[dict], count: int) -> list[str]:
    """Per evaluation length: the mean accuracy over the runs (%), each run's in brackets."""
    cells = []
    for i in range(count):
        accs = [100 * r["evals"][i]["accuracy"] for r in runs]
        cells.append(f"{sum(accs) / len(accs):.1f} ({' / '.join(f'{a:.0f}' for a in accs)})")
    return cells


def table(folder: Path) -> str:
    """A markdown table: accuracy by evaluation length, mean over seeds (each seed in brackets)."""
    results = load_results(folder)
    lengths = _lengths(results)
    lines = ["| arm | seeds | " + " | ".join(_length_labels(results)) + " |",
             "|---|---|" + "---|" * len(lengths)]
    for arm in [a for a in ARMS if a in results]:
        runs = sorted(results[arm], key=lambda r: r["seed"])
        lines.append(f"| {LABELS[arm]} | {', '.join(str(r['seed']) for r in runs)} | "
                     + " | ".join(_length_cells(runs, len(lengths))) + " |")
    return "\n".join(lines + spread_lines(results))


def _by_window(folders, seeds=None) -> dict[tuple[str, int], list[dict]]:
    """{(arm, local window): its runs} over several OUT folders, optionally of the given seeds only
    (SystemExit if a folder has no results, if a run of the same arm, window and seed is found
    twice, or if the runs were evaluated at different lengths)."""
    grouped: dict[tuple[str, int], list[dict]] = {}
    for folder in folders:
        for arm, runs in load_results(Path(folder)).items():
            for run in runs:
                if seeds is not None and run["seed"] not in seeds:
                    continue
                key = (arm, run["setup"]["window"])
                if any(r["seed"] == run["seed"] for r in grouped.get(key, [])):
                    raise SystemExit(f"recall_pilot: {arm} window {key[1]} seed {run['seed']} "
                                     f"is in more than one of {[str(f) for f in folders]}")
                grouped.setdefault(key, []).append(run)
    if not grouped:
        raise SystemExit(f"recall_pilot: no runs of seeds {seeds} in {[str(f) for f in folders]}")
    lengths = {tuple(r["setup"]["eval_lens"]) for runs in grouped.values() for r in runs}
    if len(lengths) > 1:
        raise SystemExit(f"recall_pilot: the runs were evaluated at different lengths: {sorted(lengths)}")
    return {key: sorted(grouped[key], key=lambda r: r["seed"])
            for key in sorted(grouped, key=lambda k: (list(ARMS).index(k[0]), k[1]))}


def window_table(folders, seeds=None) -> str:
    """The local-window lever: for each arm and window among the folders' runs, the final loss on
    the answers and the accuracy by evaluation length (mean over seeds, each seed in brackets)."""
    grouped = _by_window(folders, seeds)
    lengths = _lengths(grouped)
    lines = ["| arm | window | seeds | loss on the answers | " + " | ".join(_length_labels(grouped)) + " |",
             "|---|---|---|---|" + "---|" * len(lengths)]
    for (arm, window), runs in grouped.items():
        loss = sum(r["final_loss"] for r in runs) / len(runs)
        lines.append(f"| {LABELS[arm]} | {window} | {', '.join(str(r['seed']) for r in runs)} | "
                     f"{loss:.2f} | " + " | ".join(_length_cells(runs, len(lengths))) + " |")
    return "\n".join(lines)


def lever_reference(arm: str) -> str | None:
    """The arm a lever is read against, seed by seed: the base arm of its global kind, or for a
    6-layer arm (LLLLLG, the frozen phase at LLG) the LLG ratio of its kind, which shares its depth;
    None for a base arm."""
    kind = ARMS[arm][1]
    base, llg = f"hybrid-{kind}", f"hybrid-{kind}-llg"
    if arm in (base, llg):
        return None
    return llg if len(ARMS[arm][0]) == len(ARMS[llg][0]) else base


def _levers(folders, seeds=None) -> dict[str, list[dict]]:
    """{arm: its runs at the pilot's default window} over the folders (the window lever has its
    own table)."""
    grouped = {arm: runs for (arm, window), runs in _by_window(folders, seeds).items()
               if window == Setup.window}
    if not grouped:
        raise SystemExit(f"recall_pilot: no runs at window {Setup.window} in {[str(f) for f in folders]}")
    return grouped


def lever_table(folders, seeds=None) -> str:
    """Two markdown tables. Per arm: each seed's recall (mean over the evaluation lengths), the mean,
    the mean at the longest length, and the difference from its reference arm seed by seed (a seed
    fixes the batches and the random draws of the weights, so the two runs differ by the lever).
    Per lever run on both global kinds: TAPA's mean against NoPE's, with the one-sided exact
    Mann-Whitney p that TAPA's seeds recall more."""
    grouped = _levers(folders, seeds)
    lines = [f"| arm | seeds | recall by seed | mean | at {_length_labels(grouped)[-1]} "
             "| reference | minus the reference, by seed | higher on |", "|---|---|---|---|---|---|---|---|"]
    for arm, runs in grouped.items():
        values = [mean_recall(r) for r in runs]
        longest = sum(100 * r["evals"][-1]["accuracy"] for r in runs) / len(runs)
        row = (f"| {LABELS[arm]} | {', '.join(str(r['seed']) for r in runs)} | "
               f"{' / '.join(f'{v:.1f}' for v in values)} | {sum(values) / len(values):.1f} | {longest:.1f} | ")
        reference = lever_reference(arm)
        base = {r["seed"]: mean_recall(r) for r in grouped.get(reference, [])}
        shared = [(mean_recall(r), base[r["seed"]]) for r in runs if r["seed"] in base]
        if shared:
            diffs = [v - b for v, b in shared]
            row += (f"{LABELS[reference]} | {' / '.join(f'{d:+.1f}' for d in diffs)} | "
                    f"{sum(d > 0 for d in diffs)} of {len(diffs)} |")
        else:
            row += "| | |"
        lines.append(row)
    pairs = []
    for arm in grouped:
        if ARMS[arm][1] == "tapa" and arm.replace("-tapa", "-nope", 1) in grouped:
            tapa = [mean_recall(r) for r in grouped[arm]]
            nope = [mean_recall(r) for r in grouped[arm.replace("-tapa", "-nope", 1)]]
            _, p = mann_whitney_exact(nope, tapa)  # U counts NoPE below TAPA: p that TAPA is higher
            ta, na = sum(tapa) / len(tapa), sum(nope) / len(nope)
            lever = arm[len("hybrid-tapa-"):] or "base (LLLG)"
            pairs.append(f"| {lever} | {ta:.1f} ({len(tapa)}) | {na:.1f} ({len(nope)}) | {ta - na:+.1f} | {p:.2f} |")
    if pairs:
        lines += ["", "TAPA against NoPE globals under each lever run on both (mean recall over the "
                  "lengths, seeds in brackets; one-sided exact Mann-Whitney p that TAPA recalls more):", "",
                  "| lever | TAPA globals | NoPE globals | TAPA minus NoPE | p |", "|---|---|---|---|---|", *pairs]
    return "\n".join(lines)


def plot_levers(folders, path: Path, seeds=None) -> Path:
    """One panel per global kind: each arm's seeds (recall, mean over the lengths) as dots, beside
    them hollow at the longest length alone, a seed's runs joined between neighbouring arms of one
    depth, the mean over seeds as a bar."""
    from tapa.eval.plots import _pyplot

    plt = _pyplot()
    grouped = _levers(folders, seeds)
    kinds = [k for k in ("tapa", "nope") if any(ARMS[a][1] == k for a in grouped)]
    fig, axes = plt.subplots(1, len(kinds), figsize=(6.5 * len(kinds), 4.5), sharey=True, squeeze=False)
    for ax, kind in zip(axes[0], kinds):
        arms = [a for a in grouped if ARMS[a][1] == kind]
        for x, arm in enumerate(arms):
            values = [mean_recall(r) for r in grouped[arm]]
            ax.bar(x, sum(values) / len(values), color="0.85", width=0.6)
            for run, value in zip(grouped[arm], values):
                color = f"C{run['seed'] % 10}"
                ax.plot(x, value, "o", color=color, ms=5)
                ax.plot(x + 0.2, 100 * run["evals"][-1]["accuracy"], "o", mfc="none", color=color, ms=5)
        for x, (left, right) in enumerate(zip(arms, arms[1:])):  # neighbours of one depth
            if len(ARMS[left][0]) != len(ARMS[right][0]):
                continue
            ours = {r["seed"]: mean_recall(r) for r in grouped[right]}
            for run in grouped[left]:
                if run["seed"] in ours:
                    ax.plot([x, x + 1], [mean_recall(run), ours[run["seed"]]],
                            color=f"C{run['seed'] % 10}", lw=0.7, alpha=0.5)
        ax.axhline(100 / N_VALUES, color="gray", ls=":", lw=0.8)
        names = [LABELS[a].split(", ", 1)[1] if ", " in LABELS[a] else "base" for a in arms]
        ax.set_xticks(range(len(arms)), names, rotation=30, ha="right", fontsize=8)
        ax.set_title(f"{'TAPA' if kind == 'tapa' else 'NoPE'} globals (window {Setup.window}): "
                     "recall by seed, mean over lengths", fontsize=9)
        ax.grid(True, axis="y", alpha=0.3)
    seeds_seen = sorted({r["seed"] for runs in grouped.values() for r in runs})
    longest = _lengths(grouped)[-1]
    axes[0][-1].legend([plt.Line2D([], [], marker="o", ls="", color=f"C{s % 10}") for s in seeds_seen]
                       + [plt.Line2D([], [], marker="o", ls="", mfc="none", color="0.3")],
                       [f"seed {s}" for s in seeds_seen] + [f"hollow: at {longest} alone"],
                       fontsize=7, loc="upper right")
    axes[0][0].set_ylabel("% of answers right (chance dotted)")
    fig.tight_layout()
    save_png(fig, path, dpi=120)
    plt.close(fig)
    return path


def _recall_lines(ax, runs: list[dict], color: str, label: str) -> list[int]:
    """Accuracy by evaluation length on `ax`: each run faint, their mean bold; returns the lengths."""
    lengths = [e["length"] for e in runs[0]["evals"]]
    accs = [[100 * e["accuracy"] for e in r["evals"]] for r in runs]
    for acc in accs:
        ax.plot(lengths, acc, color=color, alpha=0.25, lw=0.8, marker=".")
    ax.plot(lengths, [sum(a[i] for a in accs) / len(accs) for i in range(len(lengths))],
            color=color, marker="o", label=label)
    return lengths


def plot_windows(folders, path: Path, seeds=None) -> Path:
    """Accuracy by evaluation length, one panel per arm run at 2+ windows (every arm if none is),
    one line per local window (the mean over seeds, each seed faint)."""
    from tapa.eval.plots import _pyplot

    plt = _pyplot()
    grouped = _by_window(folders, seeds)
    arms = list(dict.fromkeys(arm for arm, _ in grouped))
    arms = [a for a in arms if sum(arm == a for arm, _ in grouped) > 1] or arms
    windows = sorted({window for _, window in grouped})
    fig, axes = plt.subplots(1, len(arms), figsize=(5.5 * len(arms), 4), sharey=True, squeeze=False)
    for ax, arm in zip(axes[0], arms):
        for (other, window), runs in grouped.items():
            if other != arm:
                continue
            lengths = _recall_lines(ax, runs, f"C{windows.index(window)}",
                                    f"window {window} ({len(runs)} seeds)")
        ax.axhline(100 / N_VALUES, color="gray", ls=":", lw=0.8)
        ax.set(xscale="log", xlabel="sequence length (tokens)", title=LABELS[arm])
        ax.set_xticks(lengths, [str(n) for n in lengths])
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    axes[0][0].set_ylabel("% of answers right (chance dotted)")
    fig.tight_layout()
    save_png(fig, path, dpi=120)
    plt.close(fig)
    return path


def plot(folder: Path, path: Path) -> Path:
    """Two panels: the training loss on the answers by step, and accuracy by evaluation length;
    one line per arm (mean over its seeds, each seed faint)."""
    from tapa.eval.plots import _pyplot

    plt = _pyplot()
    results = load_results(folder)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    top = max(100 * e["accuracy"] for runs in results.values() for r in runs for e in r["evals"])
    for index, arm in enumerate(a for a in ARMS if a in results):
        color = f"C{index}"
        runs = results[arm]
        curves = [r["loss_curve"] for r in runs]
        every = runs[0]["setup"]["steps"] / len(curves[0])
        steps = [every * (i + 1) for i in range(len(curves[0]))]
        for curve in curves:
            left.plot(steps, curve, color=color, alpha=0.25, lw=0.8)
        left.plot(steps, [sum(c[i] for c in curves) / len(curves) for i in range(len(steps))],
                  color=color, label=f"{LABELS[arm]} ({len(runs)} seed{'s' if len(runs) > 1 else ''})")
        lengths = _recall_lines(right, runs, color, LABELS[arm])
    chance = math.log(N_VALUES)
    left.axhline(chance, color="gray", ls=":", lw=0.8)
    left.set(xlabel="training step", ylabel="loss on the answers (nats)",
             title=f"Learning to recall (chance: ln {N_VALUES} = {chance:.2f})")
    right.set(xscale="log", xlabel="sequence length (tokens)", ylabel="% of answers right",
              title=f"Recall vs length (trained at {runs[0]['setup']['train_len']})",
              ylim=(0, min(100, max(10, 10 * math.ceil(1.2 * top / 10)))))
    right.set_xticks(lengths, [str(n) for n in lengths])
    for ax in (left, right):
        ax.grid(True, alpha=0.3)
    left.legend(fontsize=7)
    fig.tight_layout()
    save_png(fig, path, dpi=120)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arms", nargs="+", choices=sorted(ARMS), default=list(ARMS))
    parser.add_argument("--seeds", nargs="+", type=int, default=None,
                        help="seeds to train (default 0); with --windows or --levers, the seeds to report")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--steps", type=int, default=Setup.steps)
    parser.add_argument("--window", type=int, default=Setup.window)
    parser.add_argument("--batch", type=int, default=Setup.batch)
    parser.add_argument("--dim", type=int, default=Setup.dim)
    parser.add_argument("--heads", type=int, default=Setup.heads)
    parser.add_argument("--lr", type=float, default=Setup.lr)
    parser.add_argument("--eval-lens", type=int, nargs="+", default=list(Setup.eval_lens))
    parser.add_argument("--eval-seqs", type=int, default=Setup.eval_seqs,
                        help="sequences a length (each asks every pair once)")
    parser.add_argument("--table", type=Path, help="print the table of a finished OUT and exit")
    parser.add_argument("--windows", type=Path, nargs="+", metavar="OUT",
                        help="print the local-window table over finished OUTs (one window or several each) and exit")
    parser.add_argument("--levers", type=Path, nargs="+", metavar="OUT",
                        help="print the lever tables over finished OUTs (each arm against its "
                             "reference seed by seed, TAPA against NoPE per lever) and exit")
    parser.add_argument("--plot", type=Path, help="with --table, --windows or --levers: also write this plot (PNG)")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    if args.table:
        print(table(args.table))
        if args.plot:
            plot(args.table, args.plot)
        return
    if args.windows:
        print(window_table(args.windows, args.seeds))
        if args.plot:
            plot_windows(args.windows, args.plot, args.seeds)
        return
    if args.levers:
        print(lever_table(args.levers, args.seeds))
        if args.plot:
            plot_levers(args.levers, args.plot, args.seeds)
        return
    if args.out is None:
        parser.error("--out is required (or --table, --windows or --levers)")
    setup = Setup(steps=args.steps, window=args.window, batch=args.batch, lr=args.lr, dim=args.dim,
                  heads=args.heads, eval_lens=tuple(args.eval_lens), eval_seqs=args.eval_seqs)
    for seed in args.seeds or [0]:
        for arm in args.arms:
            if (args.out / f"{arm}-s{seed}.json").exists():
                continue
            result = run_arm(arm, seed, setup, args.out, progress=not args.no_progress)
            accs = " ".join(f"{e['length']}:{100 * e['accuracy']:.0f}%" for e in result["evals"])
            print(f"{arm} seed {seed}: loss {result['final_loss']:.3f}, {accs} "
                  f"({result['train_s']:.0f} s train, {result['eval_s']:.0f} s eval)", flush=True)


if __name__ == "__main__":
    main()
