"""Aggregate the toy study's job JSONs (lab/study/run.py) into tables, plots and a README.

    python3 -m lab.study.aggregate aggregate --in /tmp/archives --out results/toy-study

--in takes folders (searched for *.job.json and *.tar.gz), job JSON files and the runner's archives.
Every number written comes from the job JSONs. Written to --out:
    jobs.csv                          one row per job
    lr_sweep.csv, lr_sweep.md         per family and arm, each lr: final validation loss, zero-shot ppl
    perplexity.csv                    per stage, arm, length: mean, std (over seeds), n, the values
    perplexity_{zero_shot,continual}.md  and .png (log-log, error bars: one std over seeds); with
                                      several continual lrs, the .png holds the latest protocol's
                                      and perplexity_continual_all.png every one
    passkey.csv, passkey.md, passkey.png   accuracy per length and depth, mean over seeds
    passkey_depths.png                accuracy vs the key's depth per length, arms with 2+ seeds
    theory_trained.csv, .md, .png     logit moments vs distance on trained weights (tapa.theory.trained)
    training_curves.png               pretraining loss vs step, per arm and seed
    coverage.md                       the seeds each arm has per measurement (what is still missing)
    comparisons.csv, comparisons.md   the study's questions as pairs of arms, per length (zero-shot):
                                      one-sided Welch and exact Mann-Whitney p-values each way
    comparisons.png                   those pairs seed by seed (one point per seed and length)
    repeats.csv, .md, .png            jobs run more than once (same seed): kept run vs repeat per length
    commands.md                       every job's exact commands
    README.md                         protocol, hardware, dates, tables. Rewritten in place when it
                                      exists (`merge_readme`): its "## Headline" section, and in
                                      every section the lines from a `<!-- notes -->` line on, are
                                      the lead's and are kept; so are sections the skeleton lacks
Each arm is reported at its main lr: the lr with the most seeds (ties: the lowest validation loss).

    python3 -m lab.study.aggregate compare --base JOBS/toy-study/jobs --other JOBS/toy-study/scale-768/jobs --out results/toy-study/scale-768

(JOBS: the study's job JSONs, in git history since issue 33; results/toy-study/README.md, "This
folder", says how to get them back.)

writes vs_<base protocol>.md, .csv and .png to --out: each arm of the other protocol next to the
same arm of the base one (the base's continual stage from its jobs with the same continual
protocol), and each protocol's gap to --anchor (default rope-yarn) at every length.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import math
import statistics
import tarfile
from collections import defaultdict
from pathlib import Path

from tapa._paths import write_csv
from tapa.eval.plots import length_label

JOB_KIND = "tapa-study-job"
STAGE_NAMES = {"eval0": "zero-shot", "eval1": "continual"}


# ---------------------------------------------------------------------------------------------
# reading

# protocol fields that only plan or analyse runs: jobs that differ in them are comparable (the
# second domain adds evaluations and changes none of the others)
PLAN_ONLY = ("name", "sweep_lrs", "seeds", "theory_len", "theory_sequences", "rate_scale", "domain")
# the continual stage and what is measured after it: jobs that differ only here share their
# pretraining numbers (zero-shot, learning-rate sweep, theory) but not their continual ones
CONTINUAL_FIELDS = ("continual_len", "continual_batch", "continual_steps", "continual_tokens",
                    "continual_flags", "continual_lr_scale", "passkey_lengths", "passkey_depths",
                    "passkey_trials", "retrieval_tasks", "task_trials")
# fields added after jobs were recorded, with the value those jobs ran with: that value hashes as
# if the field were absent, so the older jobs keep their ids
ADDED_LATER = {"continual_lr_scale": 1.0, "retrieval_tasks": [], "task_trials": None}


def _same(a, b) -> bool:
    """Equal as JSON (a protocol's tuples are a job JSON's lists)."""
    return json.dumps(a) == json.dumps(b)


def protocol_fingerprint(protocol: dict, part: str = "all") -> str:
    """Short hash of what a job's numbers depend on: all of them (part="all") or the pretraining
    and its evaluations only (part="pretrain"). Computed from the protocol a job JSON records, so
    jobs written before a plan-only or later-added field existed still match."""
    if part not in ("all", "pretrain"):
        raise ValueError(f"part must be 'all' or 'pretrain', not {part!r}")
    left_out = PLAN_ONLY + (CONTINUAL_FIELDS if part == "pretrain" else ())
    values = {k: v for k, v in protocol.items()
              if k not in left_out and not (k in ADDED_LATER and _same(ADDED_LATER[k], v))}
    return hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()[:12]


def load_jobs(paths, repeats: list | None = None) -> list[dict]:
    """Job JSONs from folders, files and .tar.gz archives; one per (protocol, job): the one with
    the most finished stages, then the latest. The others of a job (a repeat of the same command
    and seed, or an earlier partial run) go to `repeats` when a list is given."""
    files = []
    for path in map(Path, paths):
        if path.is_dir():
            files += sorted(p for p in path.rglob("*") if p.name.endswith((".job.json", ".tar.gz")))
        elif path.is_file():
            files.append(path)
        else:
            raise ValueError(f"{str(path)!r} does not exist")
    found = []
    for path in files:
        if path.name.endswith(".tar.gz"):
            with tarfile.open(path) as tar:
                found += [json.load(tar.extractfile(m)) for m in tar.getmembers()
                          if m.isfile() and m.name.endswith(".job.json")]
        else:
            found.append(json.loads(path.read_text()))
    if not found:
        raise ValueError(f"no job JSONs (*.job.json, or in *.tar.gz archives) under {list(map(str, paths))}")
    best = {}
    for job in found:
        if job.get("kind") != JOB_KIND:
            raise ValueError(f"not a study job JSON: {str(job)[:80]}")
        job["protocol_id"] = protocol_fingerprint(job["protocol"])  # today's rule, for old jobs too
        job["pretrain_id"] = protocol_fingerprint(job["protocol"], "pretrain")
        key = (job["protocol_id"], job["job"])
        rank = (len(job["stages_done"]), job["date"])
        if key not in best or rank > (len(best[key]["stages_done"]), best[key]["date"]):
            best[key] = job
    if repeats is not None:
        # a kept job, or the same JSON found twice (a folder and an archive), is not a repeat
        seen = {(j["protocol_id"], j["job"], j["date"]) for j in best.values()}
        for job in found:
            key = (job["protocol_id"], job["job"], job["date"])
            if key not in seen:
                seen.add(key)
                repeats.append(job)
    return sorted(best.values(), key=lambda j: (j.get("arm_index", 0), j["arm"], j["lr"], j["seed"]))


def select_protocol(jobs: list[dict], protocol_id: str | None = None) -> list[dict]:
    """The jobs of one pretraining protocol (`protocol_id`: its pretrain id, or a job's full id);
    they may differ in their continual stage (continual_variants)."""
    ids = sorted({j["pretrain_id"] for j in jobs})
    if protocol_id is None and len(ids) > 1:
        names = {i: next(j["protocol"]["name"] for j in jobs if j["pretrain_id"] == i) for i in ids}
        raise ValueError(f"the jobs come from {len(ids)} pretraining protocols {names}; pick one "
                         "with --protocol-id")
    wanted = protocol_id or ids[0]
    pretrain_id = next((j["pretrain_id"] for j in jobs if wanted in (j["pretrain_id"], j["protocol_id"])),
                       None)
    chosen = [j for j in jobs if j["pretrain_id"] == pretrain_id]
    if not chosen:
        raise ValueError(f"no jobs of protocol {protocol_id!r} (found {ids})")
    return chosen


def pretrain_jobs(jobs: list[dict]) -> list[dict]:
    """One job per (arm, lr, seed) for the pretraining numbers: a job re-run under another
    continual stage trained its own model, but one seed is counted once (the latest run)."""
    latest = {}
    for job in jobs:
        if "pretrain" in job["stages_done"]:
            key = (job["arm"], job["lr"], job["seed"])
            if key not in latest or job["date"] > latest[key]["date"]:
                latest[key] = job
    return [j for j in jobs if latest.get((j["arm"], j["lr"], j["seed"])) is j]


def continual_scale(job: dict) -> float:
    """The job's continual lr over its pretraining lr: the scale the runner records per job (an
    arm's own may differ from the protocol's), else the protocol's (1.0 for jobs recorded before
    that field)."""
    protocol_scale = job["protocol"].get("continual_lr_scale", ADDED_LATER["continual_lr_scale"])
    return job.get("continual_lr_scale", protocol_scale)


def continual_variants(jobs: list[dict]) -> list[dict]:
    """The jobs with a continual stage, for the continual tables; when they ran more than one
    continual protocol, each arm is split by it ("rope-cl0.1", "RoPE [continual lr x0.1]")."""
    mine = [j for j in jobs if j["results"].get("eval1") or j["results"].get("passkey")]
    if len({j["protocol_id"] for j in mine}) < 2:
        return mine
    ids_per_scale = defaultdict(set)
    for job in mine:
        ids_per_scale[continual_scale(job)].add(job["protocol_id"])
    out = []
    for job in mine:
        scale = continual_scale(job)
        # two continual protocols at one lr scale differ elsewhere: their ids tell them apart
        which = f"-{job['protocol_id'][:6]}" if len(ids_per_scale[scale]) > 1 else ""
        out.append({**job, "arm": f"{job['arm']}-cl{scale:g}{which}",
                    "label": f"{job['label']} [continual lr x{scale:g}{which.replace('-', ', ')}]"})
    return out


def mean_std(values) -> tuple[float, float, int]:
    """(mean, sample standard deviation (n - 1), n); std is nan for a single value."""
    values = [float(v) for v in values]
    n = len(values)
    if n == 0:
        return math.nan, math.nan, 0
    mean = sum(values) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else math.nan
    return mean, std, n


def perplexities(job: dict, stage: str) -> dict[int, float]:
    result = job["results"].get(stage)
    return {r["length"]: r["perplexity"] for r in result["perplexity"]} if result else {}


def val_loss(job: dict) -> float:
    pretrain = job["results"].get("pretrain") or {}
    value = pretrain.get("final_val_loss")
    return math.nan if value is None else value


def main_lrs(jobs: list[dict]) -> dict[str, float]:
    """arm -> the lr with the most seeds (ties: the lowest mean validation loss)."""
    by_arm = defaultdict(lambda: defaultdict(list))
    for job in jobs:
        by_arm[job["arm"]][job["lr"]].append(job)

    def rank(item):
        lr, group = item
        loss = mean_std([val_loss(j) for j in group])[0]
        return (-len(group), loss if loss == loss else math.inf, lr)
    return {arm: min(lrs.items(), key=rank)[0] for arm, lrs in by_arm.items()}


def arm_order(jobs: list[dict]) -> list[str]:
    """Arms in the order of the study's arm table (lab/study/arms.py)."""
    return list(dict.fromkeys(j["arm"] for j in sorted(jobs, key=lambda j: (j.get("arm_index", 0),
                                                                           j["arm"]))))


# ---------------------------------------------------------------------------------------------
# tables

def _fmt(value: float, digits: int = 2) -> str:
    if value != value:
        return ""
    return f"{value:.{digits}f}" if abs(value) < 1000 else f"{value:.0f}"


def _cell(mean: float, std: float, n: int) -> str:
    if n == 0:
        return ""
    return _fmt(mean) + (f" ± {_fmt(std)}" if n > 1 else "")


def seed_perplexities(jobs: list[dict], stage: str) -> dict[str, dict]:
    """arm -> {"job": one of its jobs, "lr": its main lr, "values": {length: [(seed, ppl), ...]}},
    the arms in table order, each at its main lr, only those with results of `stage`."""
    lrs, arms = main_lrs(jobs), {}
    for arm in arm_order(jobs):
        mine = [j for j in jobs if j["arm"] == arm and j["lr"] == lrs[arm] and j["results"].get(stage)]
        if not mine:
            continue
        values = defaultdict(list)
        for job in mine:
            for length, ppl in perplexities(job, stage).items():
                values[length].append((job["seed"], ppl))
        arms[arm] = {"job": mine[0], "lr": lrs[arm], "values": {n: sorted(values[n]) for n in sorted(values)}}
    return arms


def perplexity_summary(jobs: list[dict], stage: str) -> list[dict]:
    """One row per arm (at its main lr) and length: mean, std, n, the per-seed values."""
    rows = []
    for arm, found in seed_perplexities(jobs, stage).items():
        first = found["job"]
        for length, values in found["values"].items():
            mean, std, n = mean_std(v for _, v in values)
            rows.append({"stage": STAGE_NAMES[stage], "arm": arm, "label": first["label"],
                         "family": first["family"], "lr": found["lr"], "length": length, "n": n,
                         "mean": mean, "std": std,
                         "values": ";".join(f"s{s}={v:.4f}" for s, v in values)})
    return rows


# the study's questions as pairs of arms: is the first one's perplexity lower than the second's?
COMPARISONS = (
    ("hybrid-tapa", "hybrid-nope", "TAPA's own part inside the hybrid (vs NoPE globals)"),
    ("hybrid-tapa", "hybrid-rope-eval-yarn", "hybrid globals: TAPA vs RoPE with eval-time YaRN"),
    ("tapa", "rope-eval-yarn", "plain TAPA vs RoPE with eval-time YaRN"),
    ("tapa", "rope", "plain TAPA vs RoPE"),
    ("tapa", "nope", "plain TAPA vs NoPE"),
)


def comparison_rows(jobs: list[dict], stage: str = "eval0") -> list[dict]:
    """For each pair of COMPARISONS that has results, at each length: the seeds, means, the
    relative difference, and (with 2+ seeds a side) Welch's t-test and the exact Mann-Whitney
    test, one-sided each way: is the first arm's perplexity lower (`p_welch`, `p_mann_whitney`),
    and is the second's (`p_welch_b`, `p_mann_whitney_b`; `tapa.eval.stats`)?"""
    from tapa.eval.stats import mann_whitney_exact, welch_t

    found, rows = seed_perplexities(jobs, stage), []
    for first, second, question in COMPARISONS:
        if first not in found or second not in found:
            continue
        a_all, b_all = found[first]["values"], found[second]["values"]
        for length in sorted(set(a_all) & set(b_all)):
            a, b = [v for _, v in a_all[length]], [v for _, v in b_all[length]]
            mean_a, mean_b = mean_std(a)[0], mean_std(b)[0]
            row = {"stage": STAGE_NAMES[stage], "question": question, "a": first, "b": second,
                   "length": length, "n_a": len(a), "n_b": len(b), "mean_a": mean_a,
                   "mean_b": mean_b, "ratio": mean_a / mean_b,
                   "welch_t": math.nan, "welch_df": math.nan, "p_welch": math.nan, "p_mann_whitney": math.nan,
                   "p_welch_b": math.nan, "p_mann_whitney_b": math.nan}
            if len(a) >= 2 and len(b) >= 2:
                row["welch_t"], row["welch_df"], row["p_welch"] = welch_t(a, b)
                row["p_welch_b"] = welch_t(b, a)[2]
                row["p_mann_whitney"] = mann_whitney_exact(a, b)[1]
                row["p_mann_whitney_b"] = mann_whitney_exact(b, a)[1]
            rows.append(row)
    return rows


def comparison_markdown(rows: list[dict], labels: dict[str, str]) -> str:
    if not rows:
        return "No pair of compared arms has results yet."
    lines = ["**Seed comparisons** (one-sided each way: is A's perplexity lower than B's, and is "
             "B's lower than A's? p from Welch's t-test and from the exact Mann-Whitney test; only "
             "with 2+ seeds a side)", "",
             "| A | B | length | n (A/B) | mean A | mean B | A / B | Welch t (df) | p Welch | "
             "p Mann-Whitney | p Welch, B lower | p Mann-Whitney, B lower |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        welch = f"{r['welch_t']:.2f} ({r['welch_df']:.1f})" if r["welch_t"] == r["welch_t"] else ""
        cells = [labels.get(r["a"], r["a"]), labels.get(r["b"], r["b"]), length_label(r["length"]),
                 f"{r['n_a']}/{r['n_b']}", _fmt(r["mean_a"]), _fmt(r["mean_b"]), f"{r['ratio']:.3f}", welch,
                 _fmt(r["p_welch"], 3), _fmt(r["p_mann_whitney"], 3), _fmt(r["p_welch_b"], 3),
                 _fmt(r["p_mann_whitney_b"], 3)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def perplexity_markdown(rows: list[dict], title: str) -> str:
    lengths = sorted({r["length"] for r in rows})
    arms = list(dict.fromkeys(r["arm"] for r in rows))
    lines = [f"**{title}** (mean ± std over seeds; n seeds; lr)", "",
             "| arm | n | lr | " + " | ".join(length_label(n) for n in lengths) + " |",
             "|---|---|---|" + "---|" * len(lengths)]
    for arm in arms:
        mine = {r["length"]: r for r in rows if r["arm"] == arm}
        first = next(iter(mine.values()))
        cells = [_cell(mine[n]["mean"], mine[n]["std"], mine[n]["n"]) if n in mine else ""
                 for n in lengths]
        seeds = sorted({r["n"] for r in mine.values()})
        lines.append(f"| {first['label']} | {'/'.join(map(str, seeds))} | {first['lr']:g} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines)


def lr_sweep_rows(jobs: list[dict]) -> list[dict]:
    """Per family, arm and lr (arms run at two or more lrs): validation loss and zero-shot ppl,
    over the seeds every lr of the arm has (so the lrs are compared on the same seeds)."""
    rows = []
    by_arm = defaultdict(lambda: defaultdict(list))
    for job in jobs:
        by_arm[job["arm"]][job["lr"]].append(job)
    for arm in arm_order(jobs):
        if len(by_arm[arm]) < 2:
            continue
        common = set.intersection(*({j["seed"] for j in group} for group in by_arm[arm].values()))
        by_arm[arm] = {lr: [j for j in group if j["seed"] in common]
                       for lr, group in by_arm[arm].items()}
        if not common:
            continue
        losses = {lr: mean_std([val_loss(j) for j in group])[0] for lr, group in by_arm[arm].items()}
        finite = {lr: loss for lr, loss in losses.items() if loss == loss}
        best = min(finite, key=finite.get) if finite else None
        for lr, group in sorted(by_arm[arm].items()):
            row = {"family": group[0]["family"], "arm": arm, "label": group[0]["label"], "lr": lr,
                   "n": len(group), "final_val_loss": losses[lr], "best": lr == best}
            for length in sorted({n for j in group for n in perplexities(j, "eval0")}):
                row[f"ppl_{length}"] = mean_std(perplexities(j, "eval0")[length] for j in group
                                                if length in perplexities(j, "eval0"))[0]
            rows.append(row)
    return rows


def lr_sweep_markdown(rows: list[dict]) -> str:
    if not rows:
        return "No arm ran at more than one learning rate."
    lengths = sorted({int(k[4:]) for r in rows for k in r if k.startswith("ppl_")})
    lines = ["| family | arm | lr | seeds | final val loss | "
             + " | ".join(f"ppl {length_label(n)}" for n in lengths) + " |",
             "|---|---|---|---|---|" + "---|" * len(lengths)]
    for row in rows:
        mark = " **(best)**" if row["best"] else ""
        lines.append(f"| {row['family']} | {row['label']} | {row['lr']:g}{mark} | {row['n']} | "
                     f"{_fmt(row['final_val_loss'], 4)} | "
                     + " | ".join(_fmt(row.get(f"ppl_{n}", math.nan)) for n in lengths) + " |")
    lines += ["", "Best: the lowest final validation loss at the training length (the val split; "
              "the perplexities are on the test split, zero-shot)."]
    return "\n".join(lines)


def repeat_rows(jobs: list[dict], repeats: list[dict]) -> list[dict]:
    """Run-to-run spread at a fixed seed: for each repeat of a job (same protocol, arm, lr and
    seed, another run), its perplexity next to the kept run's, per stage both have and length.
    A stage whose evaluation or the training before it both JSONs share (the same stage dates:
    one run's stages reported again by a later call that resumed it) is the same measurement, not
    a repeat. A seed pretrained again for another continual protocol (another protocol id, the
    same pretraining) repeats the zero-shot stage of the run the zero-shot tables keep (the
    latest, `pretrain_jobs`)."""
    kept = {(j["protocol_id"], j["job"]): j for j in jobs}
    pairs = [(kept.get((r["protocol_id"], r["job"])), r, ("eval0", "eval1")) for r in repeats]
    latest = {(j["arm"], j["lr"], j["seed"]): j for j in pretrain_jobs(jobs)}
    for job in jobs:
        kept_run = latest.get((job["arm"], job["lr"], job["seed"]))
        if "pretrain" in job["stages_done"] and kept_run is not job:
            pairs.append((kept_run, job, ("eval0",)))
    rows = []
    for job, repeat, stages in sorted((p for p in pairs if p[0] is not None),
                                      key=lambda p: (p[1]["job"], p[1]["date"])):
        dates, repeat_dates = job.get("stage_dates", {}), repeat.get("stage_dates", {})
        for stage, trained_by in (("eval0", ("pretrain",)), ("eval1", ("pretrain", "continual"))):
            if stage not in stages:
                continue
            if any(dates.get(kind) is not None and dates.get(kind) == repeat_dates.get(kind)
                   for kind in (stage, *trained_by)):
                continue
            mine, theirs = perplexities(job, stage), perplexities(repeat, stage)
            for length in sorted(set(mine) & set(theirs)):
                rows.append({"job": job["job"], "label": job["label"], "lr": job["lr"],
                             "seed": job["seed"], "stage": STAGE_NAMES[stage], "length": length,
                             "kept": mine[length], "repeat": theirs[length],
                             "ratio": theirs[length] / mine[length],
                             "kept_call": job["runner"]["call"], "repeat_call": repeat["runner"]["call"]})
    return rows


def repeats_markdown(rows: list[dict]) -> str:
    """One line per (job, stage, repeat): 'kept / repeat' perplexity at each length."""
    if not rows:
        return "No job was run twice."
    lengths = sorted({r["length"] for r in rows})
    lines = ["Perplexity of the kept run / the repeat (same command, seed and data order; another "
             "machine and run), and the largest ratio between them.", "",
             "| job | stage | calls (kept, repeat) | " + " | ".join(map(str, lengths)) + " | max ratio |",
             "|---|---|---|" + "---|" * len(lengths) + "---|"]
    groups = defaultdict(dict)
    for r in rows:
        groups[(r["job"], r["stage"], r["kept_call"], r["repeat_call"])][r["length"]] = r
    for (job, stage, kept, repeat), by_length in groups.items():
        cells = [f"{_fmt(by_length[n]['kept'])} / {_fmt(by_length[n]['repeat'])}" if n in by_length else ""
                 for n in lengths]
        worst = max(max(r["ratio"], 1 / r["ratio"]) for r in by_length.values())
        lines.append(f"| `{job}` | {stage} | {kept}, {repeat} | " + " | ".join(cells) + f" | {worst:.2f} |")
    return "\n".join(lines)


def passkey_summary(jobs: list[dict]) -> dict[str, dict]:
    """arm -> grid of mean accuracy over seeds (at the arm's main lr), with n and std per cell."""
    lrs, grids = main_lrs(jobs), {}
    for arm in arm_order(jobs):
        mine = [j["results"]["passkey"]["passkey"] for j in jobs
                if j["arm"] == arm and j["lr"] == lrs[arm] and j["results"].get("passkey")]
        if not mine:
            continue
        first = mine[0]
        if any(g["lengths"] != first["lengths"] or g["depths"] != first["depths"] for g in mine):
            raise ValueError(f"arm {arm}: passkey grids of different shapes")
        cells = [[mean_std(g["accuracy"][li][di] for g in mine) for di in range(len(first["depths"]))]
                 for li in range(len(first["lengths"]))]
        label = next(j["label"] for j in jobs if j["arm"] == arm)
        family = next(j["family"] for j in jobs if j["arm"] == arm)
        grids[arm] = {"label": label, "family": family, "lr": lrs[arm], "lengths": first["lengths"],
                      "depths": first["depths"], "trials": first["trials"], "filler": first["filler"],
                      "seeds": len(mine), "accuracy": [[c[0] for c in row] for row in cells],
                      "std": [[c[1] for c in row] for row in cells]}
    return grids


def passkey_markdown(grids: dict[str, dict]) -> str:
    if not grids:
        return "No passkey results."
    lengths = next(iter(grids.values()))["lengths"]
    lines = ["| arm | seeds | " + " | ".join(length_label(n) for n in lengths) + " |",
             "|---|---|" + "---|" * len(lengths)]
    for grid in grids.values():
        per_length = [sum(row) / len(row) for row in grid["accuracy"]]
        lines.append(f"| {grid['label']} | {grid['seeds']} | "
                     + " | ".join(f"{a:.0%}" for a in per_length) + " |")
    first = next(iter(grids.values()))
    lines += ["", f"Accuracy averaged over {len(first['depths'])} depths, {first['trials']} trials "
              "per cell and seed, then over seeds; per-depth grids in passkey.csv and passkey.png."]
    return "\n".join(lines)


def coverage_markdown(jobs: list[dict], wanted: int = 3) -> str:
    """Which seeds each arm has, at its main lr, per measurement: what the study still lacks."""
    pretrained, lrs = pretrain_jobs(jobs), main_lrs(jobs)
    scales = sorted({continual_scale(j) for j in jobs if j["results"].get("eval1")}, reverse=True)
    lines = ["| arm | lr | zero-shot | " + " | ".join(f"continual x{s:g}" for s in scales)
             + " | passkey | theory |", "|---|---|---|" + "---|" * (len(scales) + 2)]

    def seeds(mine, stage):
        # jobs that asked for every stage of their arm (a continual stage: not sweep-only jobs)
        full = [j for j in mine if any(n.startswith("continual") for n in j["stages_requested"])]
        if full and not any(stage == n.split("-")[0] for j in full for n in j["stages_requested"]):
            return "n/a"  # e.g. RoPE continued with YaRN has no zero-shot run of its own
        found = sorted({j["seed"] for j in mine if j["results"].get(stage)})
        text = ",".join(map(str, found)) or "-"
        return text if len(found) >= wanted else f"{text} ({len(found)}/{wanted})"
    for arm in arm_order(jobs):
        mine = [j for j in jobs if j["arm"] == arm and j["lr"] == lrs[arm]]
        label = mine[0]["label"]
        cells = [seeds([j for j in pretrained if j in mine], "eval0")]
        cells += [seeds([j for j in mine if continual_scale(j) == s], "eval1") for s in scales]
        cells += [seeds(mine, "passkey"), seeds([j for j in pretrained if j in mine], "theory")]
        lines.append(f"| {label} | {lrs[arm]:g} | " + " | ".join(cells) + " |")
    note = (f"Seeds with each measurement at the arm's main lr; (k/{wanted}) marks fewer than {wanted}; "
            "n/a: the arm has no such stage (it reads another arm's run); an arm with no job yet is "
            "not listed.")
    return "\n".join(lines + ["", note])


def job_rows(jobs: list[dict]) -> list[dict]:
    rows = []
    for job in jobs:
        pretrain = job["results"].get("pretrain") or {}
        row = {"job": job["job"], "arm": job["arm"], "family": job["family"], "lr": job["lr"],
               "seed": job["seed"], "complete": job["complete"], "stages": ",".join(job["stages_done"]),
               "pretrain_tokens": pretrain.get("tokens"), "final_val_loss": pretrain.get("final_val_loss"),
               "tokens_per_s": pretrain.get("tokens_per_s"), "hardware": ";".join(job["hardware"]),
               "date": job["date"]}
        for stage, prefix in (("eval0", "zs"), ("eval1", "cont")):
            row.update({f"{prefix}_ppl_{n}": v for n, v in perplexities(job, stage).items()})
        rows.append(row)
    return rows


# ---------------------------------------------------------------------------------------------
# plots

_FAMILY_COLORS = {"rope": "tab:red", "nope": "tab:gray", "tapa": "tab:blue", "hybrid": "tab:green"}
_MARKERS = ("o", "s", "^", "D", "v", "P", "X")


def nice_log_ticks(low: float, high: float, most: int = 11) -> list[float]:
    """Round tick values spanning [low, high] on a log axis: evenly spaced round numbers over a
    narrow range, else mantissas (1, 2, 5, ... x 10^k) as fine as `most` ticks allow."""
    if high < 3 * low:
        from tapa._optional import require

        require("matplotlib")
        from matplotlib.ticker import MaxNLocator

        ticks = MaxNLocator(nbins=6).tick_values(low, high)
        return [float(t) for t in ticks if t > 0]
    for mantissas in ((1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 7, 8, 9), (1, 1.5, 2, 3, 5, 7), (1, 2, 5), (1,)):
        ticks = [m * 10.0 ** k for k in range(math.floor(math.log10(low)) - 1, math.ceil(math.log10(high)) + 1)
                 for m in mantissas]
        inside = [t for t in ticks if low <= t <= high]
        below, above = [t for t in ticks if t < low], [t for t in ticks if t > high]
        chosen = below[-1:] + inside + above[:1]
        if len(chosen) <= most:
            return chosen
    return chosen


def log_error_bar(mean: float, std: float, n: int) -> tuple[float, float]:
    """A seed-spread error bar (below, above the mean) for a log axis: one std, none for one seed.
    A bar cannot reach zero there, so one std wider than the mean (a seed that collapsed, another
    that did not) is cut at mean/10 below; above it stays one std."""
    std = std if n > 1 else 0.0
    return min(std, 0.9 * mean), std


def plot_perplexity(rows: list[dict], path: Path, *, title: str, train_len: int | None,
                    stride: int | None = None) -> Path:
    """Perplexity vs length, log-log, one line per arm with one-std error bars over seeds. When
    the values span more than 4x (a collapsed arm), a second panel zooms in on the best ones."""
    from tapa.eval.plots import _pyplot

    plt = _pyplot()

    def spread(r: dict) -> tuple[float, float]:
        return log_error_bar(r["mean"], r["std"], r["n"])

    low = min(r["mean"] - spread(r)[0] for r in rows)
    high = max(r["mean"] + spread(r)[1] for r in rows)
    zoom = high > 4 * low
    fig, axes = plt.subplots(1, 2 if zoom else 1, figsize=(14 if zoom else 8, 5), squeeze=False)
    best = min(r["mean"] for r in rows)  # the zoom shows the points within 2x the best mean
    zoom_low = min(r["mean"] - spread(r)[0] for r in rows if r["mean"] <= 2.0 * best)
    ranges = [(low, high)] + ([(zoom_low, 2.0 * best)] if zoom else [])
    lengths = sorted({r["length"] for r in rows})
    for ax, (bottom, top) in zip(axes[0], ranges):
        seen = defaultdict(int)
        for arm in dict.fromkeys(r["arm"] for r in rows):
            mine = sorted((r for r in rows if r["arm"] == arm), key=lambda r: r["length"])
            family = mine[0]["family"]
            index = seen[family]
            seen[family] += 1
            eval_time = "eval-time" in mine[0]["label"]
            # In the zoom, a point above the panel keeps its line but not its bar, which would
            # otherwise cross the whole panel and read as a spread of the arms shown there.
            bars = [spread(r) if ax is axes[0][0] or r["mean"] <= top else (0.0, 0.0) for r in mine]
            ax.errorbar([r["length"] for r in mine], [r["mean"] for r in mine],
                        yerr=[[b[0] for b in bars], [b[1] for b in bars]], capsize=3,
                        color=_FAMILY_COLORS.get(family), marker=_MARKERS[index % len(_MARKERS)],
                        linestyle="--" if eval_time else "-", alpha=max(0.4, 1.0 - 0.15 * index),
                        label=f"{mine[0]['label']} (n={max(r['n'] for r in mine)})")
        ticks = _log_length_axes(ax, lengths, max(bottom, 1e-3), top)
        if ax is axes[0][0]:
            ax.set_ylim(min(ticks[0], bottom / 1.02), max(ticks[-1], top * 1.02))
        else:
            ax.set_ylim(bottom / 1.02, top)
            ax.set_title(f"zoom: perplexity up to {top:.1f} (lines above leave the panel)", fontsize=9)
        if train_len:
            ax.axvline(train_len, color="gray", linestyle=":", linewidth=1.2)
            ax.annotate(f"trained at {length_label(train_len)}", (train_len, 1.0),
                        xycoords=("data", "axes fraction"), xytext=(3, -12), textcoords="offset points",
                        fontsize=8, color="gray")
        ax.set_xlabel("evaluation length (tokens)")
        ax.grid(True, which="major", alpha=0.3)
    axes[0][0].set_ylabel("perplexity, lower is better (sliding window"
                          + (f", stride {stride})" if stride else ")"))
    axes[0][0].legend(fontsize=7, loc="best")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    save_png(fig, path, dpi=130)
    plt.close(fig)
    return path


def plot_continual(continued: list[dict], rows: list[dict], out: Path, train_len: int, stride: int,
                   tables: dict) -> list[Path]:
    """The continual-stage figure. When the jobs ran more than one continual lr, the main figure
    holds the latest protocol's (its lr scale; the others would crowd it) and a second one every
    protocol; tables["continual figure"] gets the README's lines for them."""
    title = "continual perplexity vs length"
    latest = max(continued, key=lambda j: j["date"])["protocol"]
    current = latest.get("continual_lr_scale", ADDED_LATER["continual_lr_scale"])
    mine = [j for j in continued if continual_scale(j) == current]
    if len(mine) == len(continued):
        tables["continual figure"] = "![continual](perplexity_continual.png)"
        return [plot_perplexity(rows, out / "perplexity_continual.png", title=title,
                                train_len=train_len, stride=stride)]
    tables["continual figure"] = (
        f"![continual at lr x{current:g}](perplexity_continual.png)\n\nEvery continual protocol "
        "(each lr scale, the variant arms included):\n\n![continual, every protocol]"
        "(perplexity_continual_all.png)")
    return [plot_perplexity(perplexity_summary(mine, "eval1"), out / "perplexity_continual.png",
                            title=f"{title}, continual lr x{current:g} (the protocol now)",
                            train_len=train_len, stride=stride),
            plot_perplexity(rows, out / "perplexity_continual_all.png",
                            title=f"{title}, every continual protocol", train_len=train_len,
                            stride=stride)]


def plot_comparisons(jobs: list[dict], path: Path, stage: str = "eval0") -> Path | None:
    """One panel per compared pair (COMPARISONS): every seed's perplexity at each length, A's and
    B's side by side, log-log, so how far the seeds overlap shows next to the tests' p."""
    from tapa.eval.plots import _pyplot

    found = seed_perplexities(jobs, stage)
    pairs = [(a, b, question) for a, b, question in COMPARISONS if a in found and b in found]
    if not pairs:
        return None
    plt = _pyplot()
    fig, axes = _panel_grid(plt, len(pairs))
    for ax, (first, second, question) in zip(axes.flat, pairs):
        for arm, shift, marker in ((first, 0.94, "o"), (second, 1.06, "s")):
            values = found[arm]["values"]
            xs = [n * shift for n in values for _ in values[n]]
            ys = [v for n in values for _, v in values[n]]
            ax.scatter(xs, ys, marker=marker, s=18, alpha=0.8,
                       color=_FAMILY_COLORS.get(found[arm]["job"]["family"]) if arm == first else "black",
                       label=f"{found[arm]['job']['label']} (n={max(len(v) for v in values.values())})")
        shown = [v for arm in (first, second) for pts in found[arm]["values"].values() for _, v in pts]
        _log_length_axes(ax, sorted(found[first]["values"]), min(shown), max(shown), most=8)
        ax.set_ylim(min(shown) / 1.03, max(shown) * 1.03)
        ax.set_title(question, fontsize=8)
        ax.set_xlabel("evaluation length")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=6)
    return _save_panels(plt, fig, axes, len(pairs), "perplexity (one point per seed)",
                        f"{STAGE_NAMES[stage]} perplexity of the compared arms, seed by seed", path)


def plot_repeats(rows: list[dict], path: Path) -> Path | None:
    """One panel per repeated job and stage: perplexity vs length of the kept run and of its
    repeat (log-log), so where two runs of one seed part shows at a glance."""
    from tapa.eval.plots import _pyplot

    panels = defaultdict(list)
    for row in rows:
        panels[(row["label"], row["seed"], row["stage"], row["repeat_call"])].append(row)
    if not panels:
        return None
    plt = _pyplot()
    fig, axes = _panel_grid(plt, len(panels))
    for ax, ((label, seed, stage, _), mine) in zip(axes.flat, panels.items()):
        mine = sorted(mine, key=lambda r: r["length"])
        lengths = [r["length"] for r in mine]
        ax.plot(lengths, [r["kept"] for r in mine], marker="o", label=f"kept ({mine[0]['kept_call']})")
        ax.plot(lengths, [r["repeat"] for r in mine], marker="s", linestyle="--",
                label=f"repeat ({mine[0]['repeat_call']})")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"{label}, seed {seed}, {stage}", fontsize=9)
        ax.set_xlabel("evaluation length")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    return _save_panels(plt, fig, axes, len(panels), "perplexity",
                        "one job run twice: same command, seed and data order", path)


def _log_length_axes(ax, lengths: list[int], low: float, high: float, most: int = 11) -> list[float]:
    """Perplexity-vs-length axes, log-log: the evaluation lengths as x ticks, a few round
    perplexities from low to high as y ticks (powers of ten past 1e4). Returns the y ticks."""
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(lengths, [length_label(n) for n in lengths])
    ticks = nice_log_ticks(low, high, most=most)
    ax.set_yticks(ticks, [f"{t:.0e}" if t >= 1e4 else _fmt(t, 1).removesuffix(".0") for t in ticks])
    ax.minorticks_off()
    return ticks


def _panel_grid(plt, panels: int, columns: int | None = None, **subplots):
    """(fig, axes) of `columns` panels a row (default: up to 3), axes always 2-D."""
    columns = min(columns or 3, panels)
    rows = math.ceil(panels / columns)
    return plt.subplots(rows, columns, figsize=(4.6 * columns, 3.3 * rows), squeeze=False, **subplots)


def save_png(fig, path: Path, **savefig_kwargs) -> Path:
    """fig as a PNG of at most 256 colours: a plot's few flat colours survive, and the file is
    about a third of matplotlib's RGBA. Every plot the lab writes into results/ goes through it."""
    from PIL import Image

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", **savefig_kwargs)
    buffer.seek(0)
    with Image.open(buffer) as image:
        image.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)
    return Path(path)


def _save_panels(plt, fig, axes, used: int, ylabel: str, title: str, path: Path) -> Path:
    """A panel grid's common end: blank the unused panels, label the first column, title, save."""
    for ax in axes.flat[used:]:
        ax.axis("off")
    for ax in axes[:, 0]:
        ax.set_ylabel(ylabel)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    save_png(fig, path, dpi=120, bbox_inches="tight")  # tight: a legend may sit outside the axes
    plt.close(fig)
    return path


def plot_passkey(grids: dict[str, dict], path: Path) -> Path:
    """Every arm's mean heat map in one figure, on one colour scale."""
    from tapa.eval.plots import plot_passkey_heatmaps

    panels = [(g, f"{g['label']}\n({g['seeds']} seed{'s' if g['seeds'] > 1 else ''} x {g['trials']} trials)")
              for g in grids.values()]
    return plot_passkey_heatmaps(panels, path, title="passkey retrieval after the continual stage "
                                                     "(accuracy, mean over seeds)")


def plot_passkey_depths(grids: dict[str, dict], path: Path, min_seeds: int = 2) -> Path | None:
    """Retrieval against the key's depth, one panel per length, a line per arm (mean over seeds,
    bars one std): where in the context each kind of attention finds the key. Arms with fewer
    than min_seeds seeds are left out; the hybrids and the all-global arms get a row each."""
    chosen = [g for g in grids.values() if g["seeds"] >= min_seeds]
    if not chosen:
        return None
    import matplotlib.pyplot as plt

    rows = [("all-global attention", [g for g in chosen if g["family"] != "hybrid"]),
            ("hybrids (local + global)", [g for g in chosen if g["family"] == "hybrid"])]
    rows = [(name, mine) for name, mine in rows if mine]
    lengths = chosen[0]["lengths"]
    fig, axes = plt.subplots(len(rows), len(lengths), figsize=(3.6 * len(lengths), 3.2 * len(rows) + 0.8),
                             squeeze=False, sharey=True)
    for (name, mine), line in zip(rows, axes):
        for li, (ax, length) in enumerate(zip(line, lengths)):
            for grid in mine:
                ax.errorbar(grid["depths"], grid["accuracy"][li], yerr=grid["std"][li], marker="o",
                            markersize=3, capsize=2, linewidth=1.2,
                            label=f"{grid['label']} (n={grid['seeds']})")
            ax.set_title(f"{name}, {length_label(length)}", fontsize=9)
            ax.set_xlabel("key depth")
            ax.set_ylim(-0.03, 1.03)
            ax.grid(alpha=0.3)
        line[-1].legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    return _save_panels(plt, fig, axes, axes.size, "accuracy",
                        "passkey retrieval by the key's depth after the continual stage (0: the "
                        "context's start, 1: next to the question; mean over seeds, bars one std; "
                        f"arms with {min_seeds}+ seeds)", path)


def theory_rows(jobs: list[dict]) -> list[dict]:
    """The theory-on-trained-weights rows of every job (tapa.theory.trained, pooled over heads)."""
    rows = []
    for job in jobs:
        theory = job["results"].get("theory")
        if not theory:
            continue
        for values in theory["rows"]:
            row = dict(zip(theory["fields"], values))
            rows.append({"arm": job["arm"], "label": job["label"], "lr": job["lr"], "seed": job["seed"],
                         "layer": theory["layer"], "kind": theory["kind"], **row})
    return rows


def plot_training_curves(jobs: list[dict], path: Path) -> Path | None:
    """Pretraining loss vs step, one panel per arm that owns its pretraining run (at its main lr),
    one line per seed, labelled with the seed's final validation loss: where seeds part ways."""
    from tapa.eval.plots import _pyplot

    lrs = main_lrs(jobs)
    runs = defaultdict(list)
    for job in jobs:
        curve = job["results"].get("pretrain", {}).get("curve")
        owner = job.get("group", "").rsplit("-lr", 1)[0]
        if curve and job["arm"] == owner and job["lr"] == lrs.get(job["arm"]):
            fields = curve["fields"]
            points = [dict(zip(fields, point)) for point in curve["points"]]
            runs[job["label"]].append((job["seed"], job["results"]["pretrain"].get("final_val_loss"),
                                       [(q["step"], q["loss"]) for q in points if q.get("loss") is not None]))
    if not runs:
        return None
    plt = _pyplot()
    fig, axes = _panel_grid(plt, len(runs), sharex=True, sharey=True)
    finals = [loss for seeds in runs.values() for _, _, curve in seeds for _, loss in curve[-3:]]
    low = min(finals)
    for ax, (label, seeds) in zip(axes.flat, runs.items()):
        for seed, val, curve in sorted(seeds, key=lambda s: s[0]):
            ax.plot([c[0] for c in curve], [c[1] for c in curve], linewidth=1.0,
                    label=f"seed {seed}" + (f" (val {val:.3f})" if val is not None else ""))
        ax.set_title(label, fontsize=9)
        ax.set_ylim(low * 0.97, low * 2.0)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    for ax in axes[-1]:
        ax.set_xlabel("pretraining step")
    return _save_panels(plt, fig, axes, len(runs), "training loss",
                        "pretraining loss per seed (main lr of each arm)", path)


THEORY_FRACTIONS = (1 / 128, 1 / 16, 1 / 4, 1.0)  # of the largest distance, after distance 1


def theory_markdown(rows: list[dict], jobs: list[dict]) -> str:
    """Per arm (at its main lr) and seed: the trained logit's mean / variance at distance 1 and at
    the distance bins nearest 1/128, 1/16, 1/4 and all of the largest, and the variance's change
    from the second of those to the last: whether the moments decay past training, seed by seed."""
    lrs = main_lrs(jobs)
    curves: dict[tuple, dict[float, tuple]] = defaultdict(dict)
    for row in rows:
        if row["estimate"] == "trained" and row["lr"] == lrs.get(row["arm"]):
            key = (row["arm"], row["label"], row["seed"], row["layer"])
            curves[key][float(row["distance"])] = (float(row["mean"]), float(row["var"]))
    if not curves:
        return ""
    distances = sorted(next(iter(curves.values())))
    largest = distances[-1]
    picks = list(dict.fromkeys([1.0] + [min(distances, key=lambda d: abs(d - f * largest))
                                        for f in THEORY_FRACTIONS]))
    header = " | ".join(f"d={d:.0f}" for d in picks)
    setups = {(j["protocol"].get("theory_sequences"), j["protocol"].get("theory_len")) for j in jobs
              if j["results"].get("theory")}
    setup = ("{} test sequences of {} tokens".format(*setups.pop()) if len(setups) == 1
             else "test sequences of the theory length")
    lines = [f"**Logit mean / variance vs distance on trained weights** (the middle global layer; "
             f"{setup}; per seed)", "",
             f"| arm | seed | layer | {header} | variance, d={picks[1]:.0f} to d={picks[-1]:.0f} |",
             "|---|---|---|" + "---|" * len(picks) + "---|"]
    changes = defaultdict(list)
    for (arm, label, seed, layer), curve in sorted(curves.items(), key=lambda kv: (kv[0][0], kv[0][2])):
        cells = " | ".join(f"{curve[d][0]:.2f} / {curve[d][1]:.2f}" if d in curve else "n/a" for d in picks)
        change = None
        if len(picks) > 1 and picks[1] in curve and picks[-1] in curve and curve[picks[1]][1] > 0:
            change = curve[picks[-1]][1] / curve[picks[1]][1] - 1.0
            changes[label].append(change)
        lines.append(f"| {label} | {seed} | {layer} | {cells} | {'n/a' if change is None else f'{change:+.0%}'} |")
    lines += ["", "Variance change per arm (mean ± std over seeds): " + "; ".join(
        f"{label} {statistics.mean(c):+.0%}" + (f" ± {statistics.stdev(c):.0%}" if len(c) > 1 else "")
        + f" (n={len(c)})" for label, c in changes.items()) + "."]
    return "\n".join(lines)


def plot_theory(rows: list[dict], jobs: list[dict], path: Path) -> Path:
    """tapa.theory.trained's panels for each arm at its main lr, first seed."""
    from tapa.theory.trained import plot

    lrs, chosen = main_lrs(jobs), {}
    for row in rows:
        if row["lr"] == lrs[row["arm"]]:
            chosen.setdefault(row["arm"], row["seed"])
            chosen[row["arm"]] = min(chosen[row["arm"]], row["seed"])
    picked = [{**r, "run": f"lr {r['lr']:g}, seed {r['seed']}", "head": "all"} for r in rows
              if r["lr"] == lrs[r["arm"]] and r["seed"] == chosen[r["arm"]]]
    return plot(picked, path, title="logit mean and variance vs distance: trained q/k (pretrained "
                                    "models) against the iid theory")


# ---------------------------------------------------------------------------------------------
# README skeleton

def _protocol_lines(jobs: list[dict]) -> list[str]:
    protocol = jobs[0]["protocol"]
    model = next((j["results"]["pretrain"]["model"] for j in jobs if j["results"].get("pretrain")), {})
    params = sorted({j["results"]["pretrain"]["num_parameters"] for j in jobs if j["results"].get("pretrain")})
    corpus = jobs[0].get("corpus") or {}
    tokens = sorted({(j.get("corpus") or {}).get("train_tokens") for j in jobs} - {None})
    shas = sorted({(j.get("corpus") or {}).get("tokenizer_sha256", "")[:12] for j in jobs})
    epochs = sorted({round(j["pretrain_epochs"], 3) for j in jobs if "pretrain_epochs" in j})
    scales = sorted({continual_scale(j) for j in jobs}, reverse=True)
    ids = sorted({j["protocol_id"] for j in jobs})
    return [
        f"- Protocol `{protocol['name']}` (pretraining id {jobs[0]['pretrain_id']}; "
        f"full id{'s' if len(ids) > 1 else ''} {', '.join(ids)}); model dim {model.get('dim')}, "
        f"{model.get('n_layers')} layers, {model.get('n_heads')} heads, vocab {model.get('vocab_size')}; "
        f"parameters {', '.join(f'{p:,}' for p in params)}.",
        f"- Corpus: {corpus.get('source', {}).get('source')} (site-packages "
        f"{corpus.get('source', {}).get('include_site_packages')}), train split "
        f"{', '.join(f'{t:,}' for t in tokens)} tokens (tokenizer sha256 {', '.join(shas)}).",
        f"- Pretraining: L={protocol['pretrain_len']}, batch {protocol['pretrain_batch']}, "
        f"{protocol['pretrain_steps']} steps = {protocol['pretrain_tokens']:,} tokens per run "
        f"({', '.join(map(str, epochs))} passes over the train split).",
        f"- Continual: L={protocol['continual_len']}, batch {protocol['continual_batch']}, "
        f"{protocol['continual_steps']} steps = {protocol['continual_tokens']:,} tokens, "
        f"passkey mix (see the commands); learning rate "
        + " or ".join(f"x{s:g}" for s in scales) + " the pretraining one (fresh AdamW state).",
        f"- Evaluation: sliding window, stride {protocol['eval_stride']}, {protocol['eval_tokens']:,} "
        f"scored test tokens per length at {', '.join(map(length_label, protocol['eval_lengths']))}.",
        f"- Passkey: lengths {', '.join(map(length_label, protocol['passkey_lengths']))}, depths "
        f"{', '.join(f'{d:g}' for d in protocol['passkey_depths'])}, {protocol['passkey_trials']} "
        "trials per cell, corpus filler.",
        f"- The plan's learning rates: {', '.join(f'{lr:g}' for lr in protocol['sweep_lrs'])}; its "
        f"seeds: {', '.join(map(str, protocol['seeds']))} (what ran: the coverage table).",
    ]


def readme_skeleton(jobs: list[dict], tables: dict[str, str], command: str) -> str:
    hardware = sorted({h for j in jobs for h in j["hardware"]})
    dates = sorted(d for j in jobs for span in j["stage_dates"].values() for d in span)
    calls = sorted({(j["runner"]["call"], j["runner"]["command"]) for j in jobs})
    complete = sum(j["complete"] for j in jobs)
    names = sorted({j["protocol"]["name"] for j in jobs})
    title = ("Toy-scale reproduction study (issue 11)" if names == ["toy-gpu"] else
             f"Reproduction study (issue 11), protocol {', '.join(f'`{n}`' for n in names)}")
    parts = [
        f"# {title}", "",
        f"Generated by `{command}` from {len(jobs)} job JSONs ({complete} complete); every number "
        "below comes from them.", "",
        "## Headline", "", "TODO (lead): what reproduces and what does not: the in-length gap to RoPE, "
        "flatness past the training length, TAPA vs NoPE, hybrid-TAPA vs hybrid-NoPE, with the seed "
        "spread.", "",
        "## Coverage", "", tables["coverage"], "",
        "## Protocol", "", *_protocol_lines(jobs), "",
        "## Hardware and dates", "",
        f"- Hardware: {'; '.join(hardware)}.",
        f"- Runs between {dates[0] if dates else '?'} and {dates[-1] if dates else '?'} (UTC).",
        f"- {len(calls)} runner calls (`scripts/gpu_study.sh` -> `lab/study/run.py`):", "",
        *[f"      {call}: {cmd}" for call, cmd in calls], "",
        "Every job's exact `tapa` commands: `commands.md`.", "",
        "## Zero-shot perplexity (after pretraining)", "", tables["zero-shot"], "",
        "![zero-shot](perplexity_zero_shot.png)", "",
        tables["comparisons"], "",
        "## After the continual stage", "", tables["continual"], "",
        tables.get("continual figure", "![continual](perplexity_continual.png)"), "",
        "## Repeat runs of one job (run-to-run spread at a fixed seed)", "", tables["repeats"], "",
        "## Learning-rate sweep", "", tables["lr"], "",
        "![training curves](training_curves.png)", "",
        "## Passkey retrieval (after the continual stage)", "", tables["passkey"], "",
        "![passkey](passkey.png)", "", tables.get("passkey depths", ""), "",
        "## Theory on trained weights", "",
        "The logit's mean and variance vs distance in the middle global layer of each pretrained "
        "model, on held-out text longer than training (`python3 -m tapa.theory.trained`), next to "
        "the iid theory: `theory_trained.csv`, `theory_trained.png`.", "",
        "![theory](theory_trained.png)", "", tables["theory"], "",
    ]
    return "\n".join(parts)


# every file `aggregate` may write; those a run does not write are removed from out_dir
OUTPUTS = ("jobs.csv", "lr_sweep.csv", "lr_sweep.md", "coverage.md", "perplexity_zero_shot.md",
           "perplexity_zero_shot.png", "perplexity_continual.md", "perplexity_continual.png",
           "perplexity_continual_all.png", "perplexity.csv", "comparisons.md", "comparisons.csv",
           "comparisons.png", "passkey.md", "passkey.csv", "passkey.png", "passkey_depths.png",
           "training_curves.png", "theory_trained.md", "theory_trained.csv", "theory_trained.png", "repeats.md",
           "repeats.csv", "repeats.png", "commands.md", "README.md")
NOTES_MARK = "<!-- notes -->"  # README: from this line to the section's end, the lead's prose


def _sections(text: str) -> tuple[list[str], list[tuple[str, list[str]]]]:
    """(lines before the first '## ' heading, [(heading, lines of its section), ...])."""
    head, sections = [], []
    for line in text.splitlines():
        if line.startswith("## "):
            sections.append((line, []))
        elif sections:
            sections[-1][1].append(line)
        else:
            head.append(line)
    return head, sections


def merge_readme(old: str, skeleton: str) -> str:
    """The skeleton's README with the lead's prose of `old` kept: the whole "## Headline"
    section, each section's lines from a NOTES_MARK line on, and the sections the skeleton has
    not (after the skeleton's, in their old order)."""
    _, old_sections = _sections(old)
    head, new_sections = _sections(skeleton)
    kept = dict(old_sections)
    lines = list(head)
    for heading, body in new_sections:
        mine = kept.get(heading)
        if heading == "## Headline" and mine is not None:
            body = mine
        elif mine is not None and NOTES_MARK in mine:
            while body and not body[-1].strip():
                body = body[:-1]
            body = body + [""] + mine[mine.index(NOTES_MARK):]
        lines += [heading, *body]
    known = {heading for heading, _ in new_sections}
    for heading, body in old_sections:
        if heading not in known:
            lines += [heading, *body]
    return "\n".join(lines).rstrip("\n")


def commands_markdown(jobs: list[dict]) -> str:
    lines = ["# Commands of every job", ""]
    for job in jobs:
        lines += [f"## {job['label']}, lr {job['lr']:g}, seed {job['seed']} (`{job['job']}`)", "",
                  "```", job.get("data_command", ""), *job["commands"].values(), "```", ""]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# the command

def aggregate(paths, out_dir: str | Path, *, protocol_id: str | None = None,
              command: str = "python3 -m lab.study.aggregate aggregate") -> list[Path]:
    """Write the tables, plots and README skeleton of the jobs in `paths` to out_dir."""
    repeats = []
    jobs = select_protocol(load_jobs(paths, repeats), protocol_id)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []

    def save(name: str, text: str) -> None:
        (out / name).write_text(text + "\n")
        written.append(out / name)

    write_csv(out / "jobs.csv", job_rows(jobs))
    written.append(out / "jobs.csv")
    pretrained, continued = pretrain_jobs(jobs), continual_variants(jobs)
    sweep = lr_sweep_rows(pretrained)
    if sweep:
        write_csv(out / "lr_sweep.csv", sweep)
        written.append(out / "lr_sweep.csv")
    tables = {"lr": lr_sweep_markdown(sweep)}
    save("lr_sweep.md", tables["lr"])
    tables["coverage"] = coverage_markdown(jobs)
    save("coverage.md", tables["coverage"])
    protocol, all_rows = jobs[0]["protocol"], []
    for stage, train_len in (("eval0", protocol["pretrain_len"]), ("eval1", protocol["continual_len"])):
        name = STAGE_NAMES[stage]
        rows = perplexity_summary(pretrained if stage == "eval0" else continued, stage)
        all_rows += rows
        tables[name] = perplexity_markdown(rows, f"{name} perplexity") if rows else "No results."
        save(f"perplexity_{name.replace('-', '_')}.md", tables[name])
        if rows and stage == "eval1":
            written += plot_continual(continued, rows, out, train_len, protocol["eval_stride"], tables)
        elif rows:
            written.append(plot_perplexity(rows, out / f"perplexity_{name.replace('-', '_')}.png",
                                           title=f"{name} perplexity vs length", train_len=train_len,
                                           stride=protocol["eval_stride"]))
    if all_rows:
        write_csv(out / "perplexity.csv", all_rows)
        written.append(out / "perplexity.csv")
    comparisons = comparison_rows(pretrained, "eval0")
    tables["comparisons"] = comparison_markdown(comparisons, {j["arm"]: j["label"] for j in pretrained})
    save("comparisons.md", tables["comparisons"])
    if comparisons:
        write_csv(out / "comparisons.csv", comparisons)
        written += [out / "comparisons.csv", plot_comparisons(pretrained, out / "comparisons.png")]
        tables["comparisons"] += "\n\n![seed by seed](comparisons.png)"
    grids = passkey_summary(continued)
    tables["passkey"] = passkey_markdown(grids)
    save("passkey.md", tables["passkey"])
    if grids:
        write_csv(out / "passkey.csv",
                  [{"arm": arm, "label": g["label"], "lr": g["lr"], "seeds": g["seeds"],
                    "trials": g["trials"], "length": n, "depth": d, "mean": g["accuracy"][li][di],
                    "std": g["std"][li][di]}
                   for arm, g in grids.items() for li, n in enumerate(g["lengths"])
                   for di, d in enumerate(g["depths"])])
        written.append(out / "passkey.csv")
        written.append(plot_passkey(grids, out / "passkey.png"))
        depths_png = plot_passkey_depths(grids, out / "passkey_depths.png")
        if depths_png:
            written.append(depths_png)
            tables["passkey depths"] = "![passkey by depth](passkey_depths.png)"
    curves_png = plot_training_curves(pretrained, out / "training_curves.png")
    if curves_png:
        written.append(curves_png)
    theory = theory_rows(pretrained)
    tables["theory"] = theory_markdown(theory, pretrained)
    if theory:
        save("theory_trained.md", tables["theory"])
        write_csv(out / "theory_trained.csv", theory)
        written += [out / "theory_trained.csv",
                    plot_theory(theory, pretrained, out / "theory_trained.png")]
    again = repeat_rows(jobs, repeats)
    tables["repeats"] = repeats_markdown(again) + ("\n\n![repeats](repeats.png)" if again else "")
    save("repeats.md", tables["repeats"])
    if again:
        write_csv(out / "repeats.csv", again)
        written += [out / "repeats.csv", plot_repeats(again, out / "repeats.png")]
    save("commands.md", commands_markdown(jobs))
    readme, skeleton = out / "README.md", readme_skeleton(jobs, tables, command)
    save("README.md", merge_readme(readme.read_text(), skeleton) if readme.exists() else skeleton)
    written = [path for path in written if path is not None]
    for name in OUTPUTS:  # an earlier aggregate's file would describe jobs no longer here
        if out / name not in written:
            (out / name).unlink(missing_ok=True)
    return written


# ---------------------------------------------------------------------------------------------
# one protocol against another (the scale step against the toy study)

def _continual_protocol(job: dict) -> dict:
    """What a job's continual numbers depend on besides its pretraining: the continual fields
    of its protocol and its own continual lr scale."""
    protocol = job["protocol"]
    return {**{f: protocol.get(f, ADDED_LATER.get(f)) for f in CONTINUAL_FIELDS if f != "continual_lr_scale"},
            "continual_lr_scale": continual_scale(job)}


def _one_continual_protocol(jobs: list[dict]) -> dict | None:
    """The continual protocol the jobs with a continual stage share (None: no such job)."""
    found = {json.dumps(_continual_protocol(j), sort_keys=True) for j in jobs if j["results"].get("eval1")}
    if len(found) > 1:
        raise ValueError("the compared jobs ran more than one continual protocol")
    return json.loads(found.pop()) if found else None


def protocol_rows(jobs: list[dict], continual_like: dict | None) -> list[dict]:
    """perplexity_summary rows of both stages, each arm at its main lr; the continual stage only
    of jobs whose continual protocol is `continual_like`."""
    continued = [j for j in jobs if j["results"].get("eval1") and _continual_protocol(j) == continual_like]
    return perplexity_summary(pretrain_jobs(jobs), "eval0") + perplexity_summary(continued, "eval1")


def compare_rows(base_jobs: list[dict], other_jobs: list[dict], anchor: str) -> list[dict]:
    """Per stage, arm of `other` and length: the other protocol's and the base protocol's mean,
    std and n, and each one's relative gap to the anchor arm in its own protocol (where both
    protocols have the anchor at that stage and length). The base's continual stage is taken
    from its jobs with the other's continual protocol."""
    continual_like = _one_continual_protocol(other_jobs)
    other = protocol_rows(other_jobs, continual_like)
    base = protocol_rows(base_jobs, continual_like)
    index = {(which, r["stage"], r["arm"], r["length"]): r
             for which, rows in (("base", base), ("other", other)) for r in rows}
    out = []
    for r in other:
        b = index.get(("base", r["stage"], r["arm"], r["length"]))
        row = {"stage": r["stage"], "arm": r["arm"], "label": r["label"], "family": r["family"],
               "length": r["length"], "other_lr": r["lr"], "other_mean": r["mean"],
               "other_std": r["std"], "other_n": r["n"], "base_lr": b["lr"] if b else math.nan,
               "base_mean": b["mean"] if b else math.nan, "base_std": b["std"] if b else math.nan,
               "base_n": b["n"] if b else 0, "other_gap": math.nan, "base_gap": math.nan}
        anchors = [index.get((which, r["stage"], anchor, r["length"])) for which in ("base", "other")]
        if all(anchors) and b:
            row["base_gap"] = b["mean"] / anchors[0]["mean"] - 1
            row["other_gap"] = r["mean"] / anchors[1]["mean"] - 1
        out.append(row)
    return out


def compare_markdown(rows: list[dict], base_name: str, other_name: str, anchor: str, anchor_label: str) -> str:
    if not rows:
        return "No arm of the compared protocol has results yet."
    lines = []
    for stage in dict.fromkeys(r["stage"] for r in rows):
        mine = [r for r in rows if r["stage"] == stage]
        lengths = sorted({r["length"] for r in mine})
        lines += [f"**{stage} perplexity, {other_name} against {base_name}** (mean ± std over seeds; "
                  f"n seeds, {base_name} / {other_name})", "",
                  "| arm | protocol | n | lr | " + " | ".join(length_label(n) for n in lengths) + " |",
                  "|---|---|---|---|" + "---|" * len(lengths)]
        for arm in dict.fromkeys(r["arm"] for r in mine):
            by_length = {r["length"]: r for r in mine if r["arm"] == arm}
            first = next(iter(by_length.values()))
            for which, name in (("base", base_name), ("other", other_name)):
                ns = sorted({r[f"{which}_n"] for r in by_length.values()})
                lrs = sorted({r[f"{which}_lr"] for r in by_length.values() if r[f"{which}_lr"] == r[f"{which}_lr"]})
                cells = [_cell(by_length[n][f"{which}_mean"], by_length[n][f"{which}_std"], by_length[n][f"{which}_n"])
                         if n in by_length else "" for n in lengths]
                lines.append(f"| {first['label'] if which == 'base' else ''} | {name} | "
                             f"{'/'.join(map(str, ns))} | {'/'.join(f'{lr:g}' for lr in lrs)} | "
                             + " | ".join(cells) + " |")
        gaps = [r for r in mine if r["other_gap"] == r["other_gap"] and r["arm"] != anchor]
        if gaps:
            lines += ["", f"Gap to {anchor_label} in the same protocol ({base_name} → {other_name}; "
                      "perplexity over the anchor's, minus 1):", "",
                      "| arm | " + " | ".join(length_label(n) for n in lengths) + " |",
                      "|---|" + "---|" * len(lengths)]
            for arm in dict.fromkeys(r["arm"] for r in gaps):
                by_length = {r["length"]: r for r in gaps if r["arm"] == arm}
                cells = [f"{by_length[n]['base_gap']:+.1%} → {by_length[n]['other_gap']:+.1%}"
                         if n in by_length else "" for n in lengths]
                lines.append(f"| {by_length[next(iter(by_length))]['label']} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines).rstrip()


def plot_compare(rows: list[dict], path: Path, base_name: str, other_name: str) -> Path:
    """Perplexity vs length per stage: the base protocol dashed with seed error bars, the other
    solid, one colour per arm."""
    from tapa.eval.plots import _pyplot

    plt = _pyplot()
    stages = list(dict.fromkeys(r["stage"] for r in rows))
    fig, axes = plt.subplots(1, len(stages), figsize=(7 * len(stages), 5), squeeze=False)
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    colors = {arm: cycle[i % len(cycle)] for i, arm in enumerate(dict.fromkeys(r["arm"] for r in rows))}
    for ax, stage in zip(axes[0], stages):
        mine = [r for r in rows if r["stage"] == stage]
        values = [v for r in mine for v in (r["base_mean"], r["other_mean"]) if v == v]
        for arm in dict.fromkeys(r["arm"] for r in mine):
            line = sorted((r for r in mine if r["arm"] == arm), key=lambda r: r["length"])
            color = colors[arm]  # one colour per arm in every panel
            based = [r for r in line if r["base_n"]]
            if based:
                bars = [log_error_bar(r["base_mean"], r["base_std"], r["base_n"]) for r in based]
                ax.errorbar([r["length"] for r in based], [r["base_mean"] for r in based],
                            yerr=[[b[0] for b in bars], [b[1] for b in bars]],
                            color=color, linestyle="--", marker="o", capsize=3, alpha=0.6,
                            label=f"{line[0]['label']}, {base_name} (n={max(r['base_n'] for r in based)})")
            ax.plot([r["length"] for r in line], [r["other_mean"] for r in line], color=color,
                    linestyle="-", marker="s", label=f"{line[0]['label']}, {other_name} (n={max(r['other_n'] for r in line)})")
        _log_length_axes(ax, sorted({r["length"] for r in mine}), min(values), max(values))
        ax.set_title(f"{stage}", fontsize=10)
        ax.set_xlabel("evaluation length (tokens)")
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    axes[0][0].set_ylabel("perplexity, lower is better")
    fig.suptitle(f"{other_name} (solid) against {base_name} (dashed)", fontsize=10)
    fig.tight_layout()
    save_png(fig, path, dpi=130)
    plt.close(fig)
    return path


def compare(base_paths, other_paths, out_dir: str | Path, *, anchor: str = "rope-yarn",
            command: str = "python3 -m lab.study.aggregate compare") -> list[Path]:
    """vs_<base protocol>.md/.csv/.png in out_dir: every arm of the other jobs' protocol next to
    the same arm of the base protocol, with both protocols' gaps to the anchor arm."""
    base = select_protocol(load_jobs(base_paths))
    other = select_protocol(load_jobs(other_paths))
    base_name, other_name = base[0]["protocol"]["name"], other[0]["protocol"]["name"]
    rows = compare_rows(base, other, anchor)
    if not rows:
        raise ValueError(f"no results in the jobs of protocol {other_name}")
    labels = {j["arm"]: j["label"] for j in base + other}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"vs_{base_name}"
    text = (f"Generated by `{command}`: every number below comes from the job JSONs of protocol "
            f"`{base_name}` ({len(base)} jobs) and `{other_name}` ({len(other)} jobs), each arm at "
            "its main lr in its own protocol; the base's continual stage is taken from its jobs "
            "with the same continual protocol.\n\n"
            + compare_markdown(rows, base_name, other_name, anchor, labels.get(anchor, anchor))
            + f"\n\n![{other_name} against {base_name}]({stem.name}.png)")
    stem.with_suffix(".md").write_text(text + "\n")
    write_csv(stem.with_suffix(".csv"), rows)
    return [stem.with_suffix(".md"), stem.with_suffix(".csv"),
            plot_compare(rows, stem.with_suffix(".png"), base_name, other_name)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m lab.study.aggregate",
                                     description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="action", required=True)
    agg = sub.add_parser("aggregate", help="tables, plots and the README from job JSONs")
    agg.add_argument("--in", dest="inputs", nargs="+", required=True,
                     help="folders, *.job.json files or the runner's .tar.gz archives")
    agg.add_argument("--out", default="results/toy-study")
    agg.add_argument("--protocol-id", default=None, help="keep the jobs of this protocol only")
    cmp = sub.add_parser("compare", help="one protocol's arms against another's (the scale step "
                         "against the toy study)")
    cmp.add_argument("--base", nargs="+", required=True, help="the base protocol's job JSONs (folders, files)")
    cmp.add_argument("--other", nargs="+", required=True, help="the compared protocol's job JSONs")
    cmp.add_argument("--anchor", default="rope-yarn", help="the arm each protocol's gaps are taken to")
    cmp.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    try:
        if args.action == "compare":
            command = (f"python3 -m lab.study.aggregate compare --base {' '.join(args.base)} --other "
                       f"{' '.join(args.other)} --anchor {args.anchor} --out {args.out}")
            written = compare(args.base, args.other, args.out, anchor=args.anchor, command=command)
        else:
            command = "python3 -m lab.study.aggregate aggregate --in " + " ".join(args.inputs) + f" --out {args.out}"
            written = aggregate(args.inputs, args.out, protocol_id=args.protocol_id, command=command)
    except ValueError as err:
        raise SystemExit(f"lab.study.aggregate: {err}") from err
    print(f"wrote {len(written)} files to {args.out}: " + ", ".join(p.name for p in written))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
