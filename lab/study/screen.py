"""Issue 37's screen in tables and plots: which global layers, under which lever, for the hybrid?

    python3 -m lab.study.screen --in ARCHIVES_OR_FOLDERS --out results/toy-study/globals

reads the study's job JSONs (lab/study/run.py) of the screen protocols (toy-gpu-screen,
toy-gpu-c4096 for the lever "continual stage at 4096", toy-gpu-cl20 for the retrofit's "continual
stage 20% of pretraining") and writes to --out:
    perplexity.csv        arm, seed, stage (zero-shot, continual), data (test split or the second
                          domain), length, perplexity
    retrieval.csv         arm, seed, task, length: correct of trials over every depth, accuracy and
                          its 95% Wilson interval; far_*: the same over the depths whose needle lies
                          beyond the largest local window (`beyond`: the window in tokens), which
                          only the global layers reach: the screen's deciding retrieval measure;
                          recall, far_recall: the mean item recall (jobs since 2026-12-06)
    retrieval_cells.csv   the same per depth (correct of trials; the arm's label is in retrieval.csv)
    screen.md             issue 37's goal, criterion by criterion, for each TAPA/NoPE pair with
                          3+ seeds a side (and the best single-key score at 8x the pretraining
                          length), the answer at a glance (each arm with 3+ seeds, the bases
                          and RoPE + YaRN: mean perplexity per length, the seed spread, the
                          ratio to RoPE + YaRN, retrieval at 8x), the progress of the screen and
                          of the confirmation (the
                          seeds each planned arm has run and has queued, the queue, the next
                          call), each lever against its global
                          kind's base arm, each TAPA arm against NoPE globals under the same
                          lever (the screen's headline), seed by seed
                          with one-sided tests where both have 2+ seeds, then perplexity and
                          retrieval per arm (the trained passkey grid, then the suite), and the
                          pretrained global layer's logit mean / variance vs distance
    perplexity.png        perplexity vs length: stage x data panels, TAPA solid, NoPE dashed
    retrieval.png         accuracy vs length per task, with Wilson intervals
    retrieval_heatmap.png per task, accuracy by arm and length
    seeds.png             each seed's value of each deciding measure, for the arms with 2+ seeds
    tradeoff.png          far perplexity against multi-key retrieval beyond the window, per seed
                          and per arm's mean: where each arm sits on the length-retrieval trade
    tradeoff_seeds3.png   the same for the arms with 3+ seeds, beside RoPE + YaRN and the bases
Every number comes from the job JSONs; an arm missing a stage shows an empty cell.
With --keep-jobs FOLDER, the job JSONs of each runner archive among --in are first copied to
FOLDER/jobs-CALL.tar.gz (results/toy-study/globals/jobs), so that the screen's later sessions
aggregate every call from the tree.
With --anchors PATH..., the RoPE + YaRN anchor's jobs (arm rope-yarn) are read from those folders
or archives too (only those: results/retrofit/toy-gpu/jobs holds the toy screen's, run with the
retrofit's group), so that the goal table can check its length criterion.
An arm run under toy-gpu-c4096 is named ARM@c4096, under toy-gpu-cl20 ARM@cl20, under
scale-768-confirm ARM@768. The retrofits of issue 38 (retrofit-tapa,
retrofit-nope) are compared with the hybrid of their kind trained from scratch; --arms keeps the
named arms only (results/retrofit: `--arms rope-yarn,hybrid-tapa,hybrid-nope,retrofit-tapa,
retrofit-nope`); --seeds the named seeds only.
"""

from __future__ import annotations

import argparse
import gzip
import io
import math
import tarfile
from collections import defaultdict
from pathlib import Path
from statistics import mean, stdev

from lab.study.aggregate import (_log_length_axes, _panel_grid, _save_panels, load_jobs, save_png, theory_markdown,
                                  theory_rows)
from lab.study.arms import confirm_plan, confirm_queue, screen_plan, screen_queue

from tapa._paths import write_csv
from tapa.eval.plots import _pyplot, length_label
from tapa.eval.report import local_window as model_window
from tapa.eval.stats import mann_whitney_exact, welch_t
from tapa.eval.tasks import SEVERAL_ITEMS, beyond_window, wilson_interval

PROTOCOL_TAGS = {"toy-gpu-screen": "", "toy-gpu-c4096": "@c4096", "toy-gpu-cl20": "@cl20",
                 "scale-768-confirm": "@768", "tiny-cpu-screen": ""}
TAPA_ONLY = ("theta", "alpha")  # lever tags with no NoPE arm
SCALE_TAGS = {"@768"}  # protocols that change the model's size, not a lever of the screen
PROTOCOL_LABELS = {"@c4096": ", continual at 4096", "@cl20": ", continual stage 20%",
                   "@768": ", 91M (scale-768)"}
STAGES = {"eval0": ("zero-shot", "test"), "eval1": ("continual", "test"),
          "domain0": ("zero-shot", "domain"), "domain1": ("continual", "domain")}
BASES = {"tapa": "hybrid-tapa", "nope": "hybrid-nope"}  # each global kind's base arm
ANCHOR = "rope-yarn"  # the goal's length anchor: RoPE continued with YaRN
PLAIN = "-plain"  # an eval-time lever's job read without it: its own arm, "ARM-plain"
OUTPUTS = ("perplexity.csv", "retrieval.csv", "retrieval_cells.csv", "screen.md",
           "perplexity.png", "retrieval.png", "retrieval_heatmap.png", "tradeoff.png")


def arm_id(job: dict) -> str:
    return tagged(job["arm"], job["protocol"]["name"])


def tagged(arm: str, protocol: str) -> str:
    """The name the tables give an arm run under a protocol: hybrid-nope@768 for scale-768-confirm."""
    return arm + PROTOCOL_TAGS.get(protocol, f"@{protocol}")


def global_kind(arm: str) -> str:
    """'tapa' or 'nope' for the screen's hybrids and the retrofits (issue 38: a RoPE model made
    such a hybrid, against the hybrid trained from scratch), else the arm's own name (an anchor)."""
    for kind, base in BASES.items():
        if any(arm == stem or arm.startswith((stem + "-", stem + "@"))
               for stem in (base, f"retrofit-{kind}")):
            return kind
    return arm


def _split_tag(arm: str) -> tuple[str, str]:
    """('hybrid-tapa-w64', '@c4096') from 'hybrid-tapa-w64@c4096'; ('rope', '') from 'rope'."""
    name, at, tag = arm.partition("@")
    return name, at + tag


def _scale(arm: str) -> str:
    """The scale an arm is compared within: its scale tag (@768), else '' (a protocol lever such as
    @c4096 is read beside the toy arms)."""
    tag = _split_tag(arm)[1]
    return tag if tag in SCALE_TAGS else ""


def _is_reference(arm: str) -> bool:
    """RoPE + YaRN or a global kind's base arm, at any scale (not under a protocol lever)."""
    name, tag = _split_tag(arm)
    return name in (ANCHOR, *BASES.values()) and tag == _scale(arm)


def base_of(arm: str) -> str | None:
    """The base arm of the arm's global kind: at the same scale (a scale step such as @768 is
    compared within itself), while a protocol lever (@c4096, @cl20) is compared with the base arm."""
    kind = global_kind(arm)
    if kind not in BASES:
        return None
    base = BASES[kind] + _scale(arm)
    return base if arm != base else None


def plain_of(arm: str) -> str:
    """The arm an eval-time lever's arm is read against within its own run: ARM-plain (same tag)."""
    name, tag = _split_tag(arm)
    return name + PLAIN + tag


def _label(job: dict) -> str:
    return job["label"] + PROTOCOL_LABELS.get(PROTOCOL_TAGS.get(job["protocol"]["name"]), "")


def screen_jobs(paths) -> list[dict]:
    """The screen protocols' jobs among the inputs (ValueError if none)."""
    jobs = [j for j in load_jobs(paths) if j["protocol"]["name"] in PROTOCOL_TAGS]
    if not jobs:
        raise ValueError(f"no jobs of the screen protocols ({', '.join(PROTOCOL_TAGS)}) in the inputs")
    return jobs


def plain_twins(jobs: list[dict]) -> list[dict]:
    """For each job of an eval-time temperature arm whose stages kept the same model read without
    it (`without_temperature`, since 2026-12-06), a job of arm ARM-plain with those readings: the
    lever's effect within one run. Its base arm's own run is another numeric draw where training
    does not repeat to the digit (NoPE's 30M seed 0 rerun read 5.5% higher at 16k zero-shot)."""
    twins = []
    for job in jobs:
        stages = {stage: {**result, **result["without_temperature"]}
                  for stage, result in job["results"].items()
                  if isinstance(result, dict) and "without_temperature" in result}
        if job.get("eval_temperature") and stages:
            for result in stages.values():
                del result["without_temperature"]
            twins.append({**job, "arm": job["arm"] + PLAIN, "eval_temperature": None,
                          "label": job["label"] + ", read without the temperature",
                          "results": {**{k: v for k, v in job["results"].items() if k in ("pretrain", "continual")},
                                      **stages}})
    return twins


def perplexity_rows(jobs: list[dict]) -> list[dict]:
    rows = []
    for job in jobs:
        for stage, (when, data) in STAGES.items():
            result = job["results"].get(stage)
            if not result:
                continue
            source = (Path(result.get("data", {}).get("source") or "domain").name
                      if data == "domain" else "test split")
            for row in result["perplexity"]:
                rows.append({"arm": arm_id(job), "label": _label(job), "kind": global_kind(job["arm"]),
                             "seed": job["seed"], "lr": job["lr"], "stage": when, "data": data,
                             "source": source, "length": row["length"],
                             "perplexity": row["perplexity"], "tokens": row["tokens"]})
    return rows


def local_window(job: dict) -> int:
    """The job's local attention window in tokens (0 for a model without local layers)."""
    for stage in ("continual", "pretrain"):
        model = (job["results"].get(stage) or {}).get("model")
        if model:
            return model_window(model)
    return 0


def retrieval_rows(jobs: list[dict]) -> tuple[list[dict], list[dict]]:
    """(per length, per cell) rows of the passkey grid (task "passkey") and of the retrieval
    suite's tasks. A length's row counts every depth (correct, trials, accuracy, its Wilson
    interval) and, as far_*, only the depths whose needle lies beyond the largest local window
    among the jobs (`tapa.eval.tasks.beyond_window`): the same cells for every arm, the retrieval
    that the global layers alone can do. A needle at depth 1.0 sits next to the question, where the
    local layers copy it."""
    window = max((local_window(job) for job in jobs), default=0)
    lengths, cells = [], []
    for job in jobs:
        result = job["results"].get("passkey") or {}
        # the passkey grid (the prompt format the continual stage trains on), then the suite
        tasks = {"passkey": result.get("passkey") or {}, **(result.get("tasks") or {})}
        for task, grid in tasks.items():
            if not grid.get("correct"):
                continue
            common = {"arm": arm_id(job), "label": _label(job), "kind": global_kind(job["arm"]),
                      "seed": job["seed"], "task": task}
            for li, length in enumerate(grid["lengths"]):
                hits = grid["correct"][li]
                beyond = [di for di, depth in enumerate(grid["depths"]) if beyond_window(length, depth, window)]
                trials = grid["trials"] * len(hits)
                far = [hits[di] for di in beyond]
                far_trials = grid["trials"] * len(far)
                low, high = wilson_interval(sum(hits), trials)
                far_low, far_high = wilson_interval(sum(far), far_trials) if far else (math.nan, math.nan)
                # the mean item recall (tapa eval's grids since 2026-12-06; NaN in older jobs)
                recall = grid["recall"][li] if grid.get("recall") else []
                far_recall = [recall[di] for di in beyond] if recall else []
                lengths.append({**common, "length": length, "correct": sum(hits), "trials": trials,
                                "accuracy": sum(hits) / trials, "low": low, "high": high,
                                "beyond": window, "far_correct": sum(far), "far_trials": far_trials,
                                "far_accuracy": sum(far) / far_trials if far else math.nan,
                                "far_low": far_low, "far_high": far_high,
                                "recall": sum(recall) / len(recall) if recall else math.nan,
                                "far_recall": sum(far_recall) / len(far_recall) if far_recall else math.nan})
                for di, depth in enumerate(grid["depths"]):  # the arm's label: retrieval.csv
                    cells.append({**{k: v for k, v in common.items() if k != "label"}, "length": length,
                                  "depth": depth, "correct": hits[di], "trials": grid["trials"],
                                  "accuracy": round(hits[di] / grid["trials"], 4),
                                  "beyond_window": beyond_window(length, depth, window)})
    return lengths, cells


def _mean_by(rows: list[dict], keys: tuple, value: str) -> dict:
    """Mean of `value` over the seeds, keyed by the other `keys`."""
    groups = defaultdict(list)
    for row in rows:
        groups[tuple(row[k] for k in keys)].append(row[value])
    return {key: sum(v) / len(v) for key, v in groups.items()}


def _arms(rows: list[dict]) -> list[str]:
    """Arms in screen order: TAPA's, then NoPE's, then anchors; each kind's base first."""
    arms = list(dict.fromkeys(r["arm"] for r in rows))
    kinds = list(BASES) + sorted({global_kind(a) for a in arms} - set(BASES))
    return sorted(arms, key=lambda a: (kinds.index(global_kind(a)), base_of(a) is not None, a))


def _number(value) -> str:
    return "" if value is None else f"{value:.2f}"


RETRIEVAL_COLUMNS = ("passkey", "single-key", "multi-key")  # the lever tables' retrieval tasks


def _measures(ppl: list[dict], retrieval: list[dict]) -> list[str]:
    """The measures that decide the question, in table order: continual-stage perplexity on the
    test split, then on the second domain, at the two longest lengths (8x-32x the pretraining
    length in the screen); then each retrieval task's accuracy at the two longest prompts."""
    far = sorted({r["length"] for r in ppl})[-2:]
    prompts = sorted({r["length"] for r in retrieval})[-2:]
    tasks = [t for t in RETRIEVAL_COLUMNS if any(r["task"] == t for r in retrieval)]
    return ([f"{data} ppl {length_label(n)}" for data in ("test", "domain") for n in far]
            + [f"{task} {length_label(n)}" for task in tasks for n in prompts])


def _per_seed(ppl: list[dict], retrieval: list[dict]) -> dict:
    """{(arm, measure): {seed: value}} for `_measures`: perplexity; retrieval accuracy in % with the
    needle beyond the local window (`retrieval_rows`' far_accuracy)."""
    wanted = set(_measures(ppl, retrieval))
    values = defaultdict(dict)
    for r in ppl:
        measure = f"{r['data']} ppl {length_label(r['length'])}"
        if r["stage"] == "continual" and measure in wanted:
            values[(r["arm"], measure)][r["seed"]] = r["perplexity"]
    for r in retrieval:
        measure = f"{r['task']} {length_label(r['length'])}"
        if measure in wanted and r["far_trials"]:
            values[(r["arm"], measure)][r["seed"]] = 100 * r["far_accuracy"]
    return values


def _comparison(ppl: list[dict], retrieval: list[dict], pairs: list[tuple[str, str]],
                intro: str, second: str) -> str:
    """A row per (arm, reference arm): perplexity ratio - 1 and retrieval points on each of
    `_measures`, over the seeds both arms have (a lever's seed against the same seed of its
    reference: seeds differ by more than most levers)."""
    values, measures = _per_seed(ppl, retrieval), _measures(ppl, retrieval)
    lines = [intro + " (perplexity: ratio - 1, lower is better; retrieval: accuracy points with the "
             "needle beyond the local window, higher is better), over the seeds both arms have. "
             "Continual stage.", "",
             f"| arm | {second} | seeds | " + " | ".join(measures) + " |",
             "|---|---|---|" + "---|" * len(measures)]
    for arm, reference in pairs:
        cells, used = [], set()
        for measure in measures:
            mine, theirs = values.get((arm, measure), {}), values.get((reference, measure), {})
            shared = sorted(set(mine) & set(theirs))
            used |= set(shared)
            if not shared:
                cells.append("")
                continue
            a = sum(mine[k] for k in shared) / len(shared)
            b = sum(theirs[k] for k in shared) / len(shared)
            cells.append(f"{a / b - 1:+.1%}" if "ppl" in measure else f"{a - b:+.0f}")
        seeds = ", ".join(map(str, sorted(used))) or "none shared"
        lines.append(f"| {arm} | {reference} | {seeds} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def lever_table(ppl: list[dict], retrieval: list[dict]) -> str:
    """Each lever's change against its kind's base arm at the lengths that decide the question."""
    arms = _arms(ppl + retrieval)
    pairs = [(arm, twin if (twin := plain_of(arm)) in arms else base_of(arm))
             for arm in arms if base_of(arm) is not None]
    return _comparison(ppl, retrieval, pairs, "Change against the base arm of the same global kind, or "
                       "against the same run read without the lever (ARM-plain) where an eval-time "
                       "lever's job kept that reading",
                       "base")


def kind_pairs(arms: list[str]) -> list[tuple[str, str]]:
    """(TAPA arm, NoPE arm) for each TAPA-global arm among `arms`: NoPE globals under the same
    levers (TAPA's own, theta and alpha, have no NoPE arm and are left out of the match), else
    the NoPE base arm, at the same scale."""
    pairs = []
    for arm in arms:
        if global_kind(arm) != "tapa" or arm.startswith("retrofit-"):
            continue
        name, tag = _split_tag(arm)
        # the same levers less TAPA's own (theta, alpha): hybrid-tapa-theta75-pk10 -> hybrid-nope-pk10
        levers = [p for p in name[len(BASES["tapa"]):].split("-") if p and not p.startswith(TAPA_ONLY)]
        candidates = ["-".join([BASES["nope"], *levers]) + tag, BASES["nope"] + tag]
        if tag not in SCALE_TAGS:
            candidates.append(BASES["nope"])
        other = next((c for c in candidates if c in arms), None)
        if other:
            pairs.append((arm, other))
    return pairs


def kind_table(ppl: list[dict], retrieval: list[dict]) -> str:
    """Each TAPA-global arm against NoPE globals under the same lever, the question the screen
    asks."""
    pairs = kind_pairs(_arms(ppl + retrieval))
    if not pairs:
        return ""
    return _comparison(ppl, retrieval, pairs, "TAPA globals against NoPE globals under the same "
                       "lever, or against the NoPE base where the lever is TAPA's own", "NoPE arm")


def _seeded(values: dict, ppl: list[dict], retrieval: list[dict], least: int,
            every_nope: bool = False) -> tuple[dict, list]:
    """({arm: its seeds} over `_per_seed`'s values, the kind pairs in which both arms have `least`
    or more seeds). With every_nope, each such TAPA arm is also paired with every other NoPE arm of
    its scale that has `least` seeds: the goal is to beat the best NoPE configuration, which may
    not be the one under the same lever."""
    seeds = defaultdict(set)
    for (arm, _), by_seed in values.items():
        seeds[arm] |= set(by_seed)
    arms = _arms(ppl + retrieval)
    pairs = [(a, b) for a, b in kind_pairs(arms) if len(seeds[a]) >= least and len(seeds[b]) >= least]
    if every_nope:
        nopes = [a for a in arms if global_kind(a) == "nope" and not a.startswith("retrofit-")
                 and len(seeds[a]) >= least]
        for tapa in dict.fromkeys(a for a, _ in kind_pairs(arms) if len(seeds[a]) >= least):
            pairs += [(tapa, b) for b in nopes if _scale(b) == _scale(tapa) and (tapa, b) not in pairs]
    return seeds, pairs


def _one_sided(mine: list[float], theirs: list[float], lower_is_better: bool) -> tuple[float, float]:
    """One-sided (Welch's t, exact Mann-Whitney) p that `mine` is better than `theirs`: lower when
    lower_is_better, else higher (both tests ask whether the first sample is lower, so higher-is-
    better values are negated)."""
    sign = 1.0 if lower_is_better else -1.0
    a, b = [sign * v for v in mine], [sign * v for v in theirs]
    return welch_t(a, b)[2], mann_whitney_exact(a, b)[1]


def goal_p(mine: list[float], theirs: list[float], lower_is_better: bool) -> float:
    """The p the goal reads for one measure: the larger of the two one-sided p-values, or the
    Mann-Whitney p alone where Welch's t has none (no spread in either sample)."""
    p_welch, p_mw = _one_sided(mine, theirs, lower_is_better)
    return p_mw if math.isnan(p_welch) else max(p_welch, p_mw)


def seed_table(ppl: list[dict], retrieval: list[dict]) -> str:
    """For each TAPA/NoPE pair of the kind table in which both arms have 2 or more seeds, and each
    pair of the goal table (3+ seeds a side, TAPA against every NoPE arm of its scale): every
    seed's value of each deciding measure, the difference of the means, and one-sided p-values that
    TAPA is better (lower perplexity, higher accuracy): Welch's t and the exact Mann-Whitney test
    (3 seeds against 3 can reach p = 0.05, no lower). The issue's goal asks for both."""
    values = _per_seed(ppl, retrieval)
    _, pairs = _seeded(values, ppl, retrieval, 2)
    pairs += [p for p in _seeded(values, ppl, retrieval, GOAL_SEEDS, every_nope=True)[1] if p not in pairs]
    if not pairs:
        return ""
    measures = _measures(ppl, retrieval)
    lines = ["Seed by seed, where both arms have 2 or more seeds: TAPA globals against NoPE globals. "
             "Values per seed (seeds in order), TAPA minus NoPE in the means, and one-sided p that "
             "TAPA is better (Welch's t; exact Mann-Whitney). Perplexity after the continual stage, "
             "retrieval in % with the needle beyond the local window.", "",
             "| arm | NoPE arm | measure | TAPA seeds | NoPE seeds | difference | p Welch | p M-W |",
             "|---|---|---|---|---|---|---|---|"]
    for tapa, nope in pairs:
        for measure in measures:
            a, b = values.get((tapa, measure)), values.get((nope, measure))
            if not a or not b or len(a) < 2 or len(b) < 2:
                continue
            lower_is_better = "ppl" in measure
            mine, theirs = [a[k] for k in sorted(a)], [b[k] for k in sorted(b)]
            p_welch, p_mw = _one_sided(mine, theirs, lower_is_better)
            shown = (lambda v: f"{v:.2f}") if lower_is_better else (lambda v: f"{v:.0f}")
            diff = sum(mine) / len(mine) - sum(theirs) / len(theirs)
            lines.append(f"| {tapa} | {nope} | {measure} | {' / '.join(map(shown, mine))} | "
                         f"{' / '.join(map(shown, theirs))} | {diff:+.2f} | "
                         f"{'' if math.isnan(p_welch) else f'{p_welch:.3f}'} | {p_mw:.3f} |")
    return "\n".join(lines)


GOAL_SEEDS = 3  # the test: 3 seeds against 3, one-sided
GOAL_P = 0.05
GOAL_ROPE_MARGIN = 0.01  # within 1% of RoPE + YaRN at every length
GOAL_SINGLE_KEY = 90.0  # % single-key at 8x the pretraining length, for the best arm


def _continual_test(ppl: list[dict]) -> dict:
    """{(arm, length): {seed: perplexity}} after the continual stage, on the test split."""
    test = defaultdict(dict)
    for r in ppl:
        if r["stage"] == "continual" and r["data"] == "test":
            test[(r["arm"], r["length"])][r["seed"]] = r["perplexity"]
    return test


def _goal_groups(measures: list[str]) -> dict:
    """The goal's two criteria of TAPA against NoPE and the measures each reads."""
    return {"perplexity": [m for m in measures if m.startswith("test ppl")],
            "multi-key": [m for m in measures if m.startswith("multi-key")]}


def reach(ppl: list[dict], retrieval: list[dict]) -> dict[str, tuple[int, str | None]]:
    """{TAPA arm: (its seeds, why its goal is out of reach, or None)} for each TAPA arm with 1 to
    GOAL_SEEDS - 1 seeds at a scale with a NoPE arm of GOAL_SEEDS+ seeds. Out of reach: against some such NoPE
    arm, on some deciding measure, the exact Mann-Whitney p stays above GOAL_P even with every
    missing seed better than every seed of both arms. With 3 seeds against 3 that p reaches 0.05
    (1 in 20) only when every TAPA seed beats every NoPE seed, so one TAPA seed that does not
    settles it. (Welch's t, the goal's other test, can only raise the p the goal reads: it is not
    needed here.) Such an arm's remaining seeds cannot change the answer; `progress_table` runs
    them last."""
    values = _per_seed(ppl, retrieval)
    seeds, _ = _seeded(values, ppl, retrieval, 1)
    arms = _arms(ppl + retrieval)
    nopes = defaultdict(list)
    for arm in arms:
        if global_kind(arm) == "nope" and not arm.startswith("retrofit-") and len(seeds[arm]) >= GOAL_SEEDS:
            nopes[_scale(arm)].append(arm)
    measures = [m for group in _goal_groups(_measures(ppl, retrieval)).values() for m in group]
    found = {}
    for tapa in arms:
        if (global_kind(tapa) != "tapa" or tapa.startswith("retrofit-") or not 0 < len(seeds[tapa]) < GOAL_SEEDS
                or not nopes.get(_scale(tapa))):
            continue
        found[tapa] = (len(seeds[tapa]), None)
        for nope, measure in ((b, m) for b in nopes[_scale(tapa)] for m in measures):
            mine, theirs = values.get((tapa, measure), {}), values.get((nope, measure), {})
            if not mine or len(theirs) < GOAL_SEEDS:
                continue
            lower = "ppl" in measure
            every = [*mine.values(), *theirs.values()]
            best = min(every) - 1.0 if lower else max(every) + 1.0  # a missing seed better than every seed
            p = _one_sided([*mine.values()] + [best] * (GOAL_SEEDS - len(mine)), list(theirs.values()), lower)[1]
            if p > GOAL_P:
                show = lambda by_seed: " / ".join(("{:.2f}" if lower else "{:.0f}%").format(by_seed[k])
                                                  for k in sorted(by_seed))
                found[tapa] = (len(seeds[tapa]), f"against {nope}, {measure}: {show(mine)} against "
                               f"{show(theirs)}, {'lower' if lower else 'higher'} is better; p {p:.2f} at best")
                break
    return found


def reach_table(reached: dict[str, tuple[int, str | None]]) -> str:
    """`reach`'s verdicts as a table."""
    if not reached:
        return ""
    lines = [f"Still within the goal's reach? Each TAPA arm with fewer than {GOAL_SEEDS} seeds, against "
             f"every NoPE arm of its scale with {GOAL_SEEDS}+ seeds: with {GOAL_SEEDS} seeds against "
             f"{GOAL_SEEDS} the exact Mann-Whitney p reaches {GOAL_P} only when every TAPA seed beats every "
             "NoPE seed on a deciding measure, so one seed that does not puts the goal out of reach, "
             "whatever the seeds still to come score. Such an arm's remaining seeds run last.", "",
             "| arm | seeds | the goal |", "|---|---|---|"]
    for arm, (count, why) in reached.items():
        lines.append(f"| {arm} | {count} | {f'out of reach ({why})' if why else 'within reach'} |")
    return "\n".join(lines)


def goal_table(ppl: list[dict], retrieval: list[dict], pretrain_len: int | None = None) -> str:
    """The issue's goal, criterion by criterion, for each TAPA arm with 3+ seeds against NoPE
    globals under its lever and against every other NoPE arm of its scale with 3+ seeds (the goal
    is to beat the best NoPE configuration; a TAPA arm meets it only against all of them): TAPA
    better beyond the seed spread (both one-sided tests at p <= 0.05 on every measure) in
    test-split perplexity at the two longest lengths and in multi-key retrieval at the two longest
    prompts (the needle beyond the local window), and within 1% of RoPE + YaRN (the arm `rope-yarn`
    at the same scale, over the seeds both have) at every length. Then the best arm's single-key
    accuracy at 8x the pretraining length, beyond the window, against the 90% goal. A criterion
    without its data says so; none is read as met. No section without such a pair."""
    values = _per_seed(ppl, retrieval)
    seeds, pairs = _seeded(values, ppl, retrieval, GOAL_SEEDS, every_nope=True)
    if not pairs:
        return ""
    measures = _measures(ppl, retrieval)
    groups = _goal_groups(measures)
    test = _continual_test(ppl)
    lines = [f"Issue 37's goal, for each TAPA arm with {GOAL_SEEDS}+ seeds against each NoPE arm "
             f"with {GOAL_SEEDS}+ seeds (NoPE under the same lever first; the goal asks TAPA to beat "
             "the best NoPE configuration, so an arm meets it only against every one): TAPA better "
             f"beyond the seed spread (one-sided Welch and exact Mann-Whitney, both p <= {GOAL_P}, "
             "on every measure; the cell shows the largest p) in test-split perplexity at the two "
             "longest lengths and in multi-key retrieval at the two longest prompts (the needle "
             "beyond the local window), and within "
             f"{GOAL_ROPE_MARGIN:.0%} of RoPE + YaRN at every length (the largest ratio to it).", "",
             "| arm | NoPE arm | seeds | perplexity, far lengths | multi-key, longest prompts | "
             "against RoPE + YaRN | goal |", "|---|---|---|---|---|---|---|"]
    verdicts = {}  # TAPA arm -> [met against each NoPE arm]
    for tapa, nope in pairs:
        cells, met = [], []
        for measure_group in groups.values():
            ps = []
            for measure in measure_group:
                a, b = values.get((tapa, measure), {}), values.get((nope, measure), {})
                if len(a) >= GOAL_SEEDS and len(b) >= GOAL_SEEDS:
                    ps.append(goal_p([a[k] for k in sorted(a)], [b[k] for k in sorted(b)], "ppl" in measure))
            if len(ps) < len(measure_group) or not ps:
                cells.append(f"not measured (fewer than {GOAL_SEEDS} seeds)")
                met.append(False)
            else:
                ok = max(ps) <= GOAL_P
                cells.append(f"{'met' if ok else 'not met'} (p {max(ps):.3f})")
                met.append(ok)
        rope = "rope-yarn" + _split_tag(tapa)[1]
        ratios, used = [], set()
        for (arm, length), mine in test.items():
            theirs = test.get((rope, length), {})
            shared = sorted(set(mine) & set(theirs)) if arm == tapa else []
            if shared:
                ratios.append(sum(mine[k] for k in shared) / sum(theirs[k] for k in shared))
                used |= set(shared)
        if ratios:
            ok = max(ratios) <= 1 + GOAL_ROPE_MARGIN
            seeds_text = ", ".join(map(str, sorted(used)))
            cells.append(f"{'met' if ok else 'not met'} (x{max(ratios):.3f}, seeds {seeds_text})")
            met.append(ok)
        else:
            cells.append(f"no {rope} arm with shared seeds")
            met.append(False)
        seed_text = f"{len(seeds[tapa])} / {len(seeds[nope])}"
        lines.append(f"| {tapa} | {nope} | {seed_text} | " + " | ".join(cells) +
                     f" | {'met' if all(met) else 'not met'} |")
        verdicts.setdefault(tapa, []).append(all(met))
    lines += ["", f"Against every NoPE arm with {GOAL_SEEDS}+ seeds: " + "; ".join(
        f"{tapa} {'meets' if all(v) else 'does not meet'} the goal ({sum(v)} of {len(v)} NoPE arms)"
        for tapa, v in verdicts.items()) + "."]
    if pretrain_len:
        target = 8 * pretrain_len
        scores = defaultdict(list)  # arm -> [(beyond the window, every depth)] a seed
        for r in retrieval:
            if r["task"] == "single-key" and r["length"] == target and r["far_trials"]:
                scores[r["arm"]].append((100 * r["far_accuracy"], 100 * r["accuracy"]))
        if scores:
            average = lambda arm, i: mean(v[i] for v in scores[arm])
            best = max(scores, key=lambda arm: average(arm, 0))
            lines += ["", f"Single-key retrieval at 8x the pretraining length ({length_label(target)}): "
                      f"the best arm, {best}, {average(best, 0):.0f}% with the needle beyond the local "
                      f"window ({average(best, 1):.0f}% over every depth), the mean of "
                      f"{len(scores[best])} seed(s) (goal {GOAL_SINGLE_KEY:.0f}%: "
                      f"{'met' if average(best, 0) >= GOAL_SINGLE_KEY else 'not met'})."]
    return "\n".join(lines)


def summary_table(ppl: list[dict], retrieval: list[dict], pretrain_len: int | None = None) -> str:
    """The answer at a glance, one row per arm that has GOAL_SEEDS+ seeds, each kind's base and
    RoPE + YaRN, grouped by scale (the largest first) and sorted by the longest length's test
    perplexity: the continual stage's test perplexity at each length (the mean over seeds), the
    seeds' standard deviation and the ratio to RoPE + YaRN of the same scale at the longest length,
    then each retrieval task at 8x the pretraining length with the needle beyond the local window
    (% of the trials, the seeds pooled; a cell names its seeds where fewer than the perplexity's,
    as after a partial job). Empty without RoPE + YaRN or a TAPA arm to read."""
    test = _continual_test(ppl)
    if not test:
        return ""
    lengths = sorted({n for _, n in test})
    far = lengths[-1]
    seeds = defaultdict(set)
    for (arm, _), by_seed in test.items():
        seeds[arm] |= set(by_seed)
    arms = [a for a in _arms(ppl) if not a.startswith("retrofit-") and not a.endswith(PLAIN)
            and (len(seeds[a]) >= GOAL_SEEDS or _is_reference(a))]
    if not any(global_kind(a) == "tapa" for a in arms) or not any(
            _split_tag(a)[0] == ANCHOR for a in arms):
        return ""
    target = 8 * pretrain_len if pretrain_len else None
    counts = {task: pooled(retrieval, task) for task in RETRIEVAL_COLUMNS}
    tasks = [t for t in RETRIEVAL_COLUMNS if any(n == target for _, n in counts[t])]
    measured = defaultdict(set)  # (arm, task) -> the seeds with that task at the target length
    for r in retrieval:
        if r["length"] == target and r["far_trials"]:
            measured[(r["arm"], r["task"])].add(r["seed"])
    lines = ["The answer at a glance: every arm with "
             f"{GOAL_SEEDS}+ seeds, each kind's base and RoPE + YaRN, after the continual stage, "
             "by scale and then by test perplexity at the longest length. Perplexity: the test "
             "split, the mean over the seeds; sd: the seeds' standard deviation"
             + (f"; retrieval at 8x the pretraining length ({length_label(target)}): % of the "
                "trials with the needle beyond the local window, the seeds pooled" if tasks else "")
             + ".", "",
             "| arm | seeds | " + " | ".join(f"ppl {length_label(n)}" for n in lengths)
             + f" | sd {length_label(far)} | {length_label(far)} / RoPE + YaRN |"
             + "".join(f" {t} {length_label(target)} |" for t in tasks),
             "|---|---|" + "---|" * (len(lengths) + 2 + len(tasks))]
    scales = sorted({_scale(a) for a in arms}, key=lambda tag: (tag == "", tag))
    for scale in scales:
        group = [a for a in arms if _scale(a) == scale and test.get((a, far))]
        group.sort(key=lambda a: mean(test[(a, far)].values()))
        rope = test.get((ANCHOR + scale, far), {})
        for arm in group:
            cells = []
            for n in lengths:
                values = list(test.get((arm, n), {}).values())
                cells.append(f"{mean(values):.2f}" if values else "")
            values = list(test[(arm, far)].values())
            cells.append(f"{stdev(values):.2f}" if len(values) > 1 else "")
            cells.append(f"x{mean(values) / mean(rope.values()):.3f}" if rope else "")
            for task in tasks:
                correct, trials = counts[task].get((arm, target), (0, 0))
                n = len(measured[(arm, task)])
                note = f" ({n} seeds)" if n < len(seeds[arm]) else ""  # a partial job left fewer
                cells.append(f"{100 * correct / trials:.0f}%{note}" if trials else "")
            lines.append(f"| {arm} | {len(seeds[arm])} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def progress_table(jobs: list[dict], deferred: dict[str, str] | None = None) -> str:
    """Issue 37's study arm by arm (lab/study/arms.py): the screen (`screen_plan`, `screen_queue`)
    and the confirmation at the scale step (`confirm_plan`, `confirm_queue`), each with the seeds
    its arms have run and those queued, the queue in order and the next runner call. A job that
    stopped before its last stage (a call's budget ran out and the machine that held its
    checkpoints went back) is listed as partial and stays queued: it has to run again from the
    start. `deferred` ({arm as the tables name it: why}, from `reach`): arms whose remaining
    seeds cannot change the answer; their jobs move to the end of the queue. Empty when none of
    the jobs is of the screen's protocols."""
    screen_protocols = {protocol for protocol, _ in screen_plan()}
    mine = [j for j in jobs if j["protocol"]["name"] in screen_protocols]
    if not mine:
        return ""
    lrs = [j["lr"] for j in mine]
    lr = max(set(lrs), key=lrs.count)  # the screen's one learning rate, as its jobs ran it
    seeds, partial = defaultdict(set), defaultdict(dict)
    for job in jobs:
        key = (job["protocol"]["name"], job["arm"])
        if job["complete"]:
            seeds[key].add(job["seed"])
        else:
            partial[key][job["seed"]] = [s for s in job["stages_requested"] if s not in job["stages_done"]]
    for key, done in seeds.items():  # a seed run whole elsewhere (another protocol id) is not partial
        for seed in done:
            partial[key].pop(seed, None)
    deferred = deferred or {}
    screen_part = _progress(seeds, partial, lr, "Screen progress", "screen_plan", "screen_queue",
                            screen_plan(), screen_queue(), deferred)
    confirm_part = _progress(seeds, partial, lr, "Confirmation progress (91M, scale-768-confirm)",
                             "confirm_plan", "confirm_queue", confirm_plan(), confirm_queue(), deferred)
    return screen_part + "\n\n" + confirm_part


def _progress(seeds: dict, partial: dict, lr: float, title: str, plan_name: str, queue_name: str,
              plan: list, queue: list, deferred: dict[str, str]) -> str:
    """One part of `progress_table`: the plan's arms with the seeds run (complete), the partial
    ones (seed -> the stages they lack) and the seeds queued, the deferred arms' last, and the
    queue's next call: its first job alone (a screen job takes 300-420 s of the call's 600, a
    confirmation job more)."""
    queue = [(p, arm, seed) for p, arm, seed in queue if seed not in seeds.get((p, arm), ())]
    late = {(p, arm) for p, arm, _ in queue if tagged(arm, p) in deferred}
    queue = [job for job in queue if job[:2] not in late] + [job for job in queue if job[:2] in late]
    queued = defaultdict(list)
    for protocol, arm, seed in queue:
        queued[(protocol, arm)].append(seed)
    lines = [f"{title}: the planned arms (`lab/study/arms.py`, `{plan_name}`), the seeds each has run "
             f"to its last stage, the partial ones and the seeds queued (`{queue_name}`).", "",
             "| arm | protocol | seeds run | partial | queued |", "|---|---|---|---|---|"]
    for key in plan:
        done = ", ".join(map(str, sorted(seeds.get(key, ())))) or "not run"
        part = ", ".join(f"{seed} (no {', '.join(stage.split('-')[0] for stage in lacking)})"
                         for seed, lacking in sorted(partial.get(key, {}).items()))
        waiting = ", ".join(map(str, sorted(queued.get(key, ())))) or "-"
        lines.append(f"| {key[1]} | {key[0]} | {done} | {part or '-'} "
                     f"| {waiting}{' (last: the goal is out of reach)' if key in late else ''} |")
    run = sum(key in seeds for key in plan)
    three = sum(len(seeds.get(key, ())) >= 3 for key in plan)
    lines += ["", f"Run: {run} of {len(plan)} arms, {three} with 3+ seeds."]
    if any(partial.get(key) for key in plan):
        lines[-1] += (" A partial job's tables hold the stages it finished; it stays queued and runs"
                      " again from the start (its checkpoints went back with the machine).")
    for protocol, arm in sorted(late):
        lines[-1] += (f" {arm}'s seeds run last: its goal is out of reach ({deferred[tagged(arm, protocol)]}),"
                      " so they describe the arm but cannot change the answer.")
    if queue:
        protocol, first_arm, first_seed = queue[0]
        lines[-1] += (f" Queued: {len(queue)} jobs, in order: "
                      + ", ".join(f"{arm}{'' if p == plan[0][0] else f' ({p})'} seed {seed}"
                                  for p, arm, seed in queue)
                      + f". The next call: `bash scripts/gpu_study.sh batch --protocol {protocol} "
                      f"--concurrent 1 --time-budget 560 --allow-partial --jobs {first_arm}:{lr:g}:{first_seed}`.")
    return "\n".join(lines)


def perplexity_table(rows: list[dict], stage: str, data: str) -> str:
    mine = [r for r in rows if r["stage"] == stage and r["data"] == data]
    if not mine:
        return ""
    means = _mean_by(mine, ("arm", "length"), "perplexity")
    lengths = sorted({r["length"] for r in mine})
    source = next(r["source"] for r in mine)
    lines = [f"**Perplexity, {stage}, {source}** (mean over seeds)", "",
             "| arm | " + " | ".join(length_label(n) for n in lengths) + " |",
             "|---|" + "---|" * len(lengths)]
    for arm in _arms(mine):
        lines.append(f"| {arm} | " + " | ".join(_number(means.get((arm, n))) for n in lengths) + " |")
    return "\n".join(lines)


def pooled(rows: list[dict], task: str, far: bool = True) -> dict:
    """{(arm, length): (correct, trials)} of one task, the seeds pooled: the depths beyond the local
    window (far), or every depth."""
    prefix = "far_" if far else ""
    counts = defaultdict(lambda: [0, 0])
    for r in rows:
        if r["task"] == task and r[prefix + "trials"]:
            counts[(r["arm"], r["length"])][0] += r[prefix + "correct"]
            counts[(r["arm"], r["length"])][1] += r[prefix + "trials"]
    return {key: tuple(value) for key, value in counts.items()}


def retrieval_table(rows: list[dict], task: str) -> str:
    counts, every = pooled(rows, task), pooled(rows, task, far=False)
    if not every:
        return ""
    window = max((r["beyond"] for r in rows), default=0)
    lengths = sorted({n for _, n in every})
    lines = [f"**{task}**: % correct with the needle more than {window} tokens back, beyond the local "
             "window (95% Wilson interval), then over every depth; seeds pooled", "",
             "| arm | " + " | ".join(length_label(n) for n in lengths) + " |",
             "|---|" + "---|" * len(lengths)]
    for arm in _arms([r for r in rows if r["task"] == task]):
        cells = []
        for n in lengths:
            if (arm, n) not in every:
                cells.append("")
                continue
            correct, trials = every[(arm, n)]
            cell = f"all {100 * correct / trials:.0f}"
            if (arm, n) in counts:
                correct, trials = counts[(arm, n)]
                low, high = wilson_interval(correct, trials)
                cell = f"{100 * correct / trials:.0f} ({100 * low:.0f}-{100 * high:.0f}); " + cell
            cells.append(cell)
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def recall_table(rows: list[dict], task: str) -> str:
    """Mean item recall of a task whose answer lists several items (the share of them named; jobs
    since 2026-12-06), beyond the local window then over every depth, seeds pooled ('' when no
    job has it)."""
    mine = [r for r in rows if r["task"] == task and not math.isnan(r["recall"])]
    if task not in SEVERAL_ITEMS or not mine:
        return ""
    window = max((r["beyond"] for r in rows), default=0)
    lengths = sorted({r["length"] for r in mine})
    every, far = _mean_by(mine, ("arm", "length"), "recall"), _mean_by(
        [r for r in mine if not math.isnan(r["far_recall"])], ("arm", "length"), "far_recall")
    lines = [f"**{task}, item recall**: mean % of the answer's items named, with the needles more than "
             f"{window} tokens back, then over every depth; seeds pooled (jobs without it left out)", "",
             "| arm | " + " | ".join(length_label(n) for n in lengths) + " |", "|---|" + "---|" * len(lengths)]
    for arm in _arms(mine):
        cells = [(f"{100 * far[(arm, n)]:.0f}; " if (arm, n) in far else "")
                 + (f"all {100 * every[(arm, n)]:.0f}" if (arm, n) in every else "") for n in lengths]
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def lever_of(arm: str) -> str:
    """The setting an arm's global kind runs under: 'hybrid-*-w128' for both 'hybrid-tapa-w128'
    and 'hybrid-nope-w128' (twins; likewise the retrofits), the arm itself for an anchor."""
    kind = global_kind(arm)
    return arm.replace(kind, "*", 1) if kind in BASES else arm


def _lever_colours(plt, arms: list[str]) -> dict[str, str]:
    """{arm: colour}, one colour a lever (`lever_of`): TAPA and NoPE twins share one."""
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"] + ["black", "grey", "olive"]
    levers = list(dict.fromkeys(lever_of(arm) for arm in arms))
    if len(levers) > len(cycle):  # the whole screen has more levers: 20 paler pairs, then black
        cycle = [plt.get_cmap("tab20")(i) for i in range(20)] + ["black"]
    return {arm: cycle[levers.index(lever_of(arm)) % len(cycle)] for arm in arms}


def _line_panels(rows: list[dict], panels: int):
    """(plt, fig, axes, arms, style) of a figure of line panels: one colour a lever, so that the
    TAPA and NoPE twins under it share one (TAPA solid, NoPE dashed)."""
    plt = _pyplot()
    fig, axes = _panel_grid(plt, panels, columns=2 if panels == 4 else None)
    arms = _arms(rows)
    colours = _lever_colours(plt, arms)
    seeds = defaultdict(set)
    for row in rows:
        seeds[row["arm"]].add(row["seed"])

    def style(arm: str) -> dict:
        # the legend names the seeds each line pools, as the arms need not have run the same ones
        n = sorted(seeds[arm])
        label = f"{arm} (seed{'s' if len(n) > 1 else ''} {', '.join(map(str, n))})"
        return {"color": colours[arm], "marker": "o", "markersize": 3,
                "linestyle": "--" if global_kind(arm) == "nope" else "-", "label": label}
    return plt, fig, axes, arms, style


def plot_perplexity(rows: list[dict], path: Path) -> Path | None:
    panels = [(s, d) for s in ("zero-shot", "continual") for d in ("test", "domain")
              if any(r["stage"] == s and r["data"] == d for r in rows)]
    if not panels:
        return None
    plt, fig, axes, arms, style = _line_panels(rows, len(panels))
    means = _mean_by(rows, ("arm", "stage", "data", "length"), "perplexity")
    for ax, (stage, data) in zip(axes.flat, panels):
        mine = {(a, n): v for (a, s, d, n), v in means.items() if (s, d) == (stage, data)}
        for arm in arms:
            points = sorted((n, v) for (a, n), v in mine.items() if a == arm)
            if points:
                ax.plot(*zip(*points), **style(arm))
        source = next(r["source"] for r in rows if r["stage"] == stage and r["data"] == data)
        _log_length_axes(ax, sorted({n for _, n in mine}), min(mine.values()), max(mine.values()))
        ax.set(title=f"{stage}, {source}", xlabel="length (tokens)")
        ax.grid(True, alpha=0.3)
    axes.flat[len(panels) - 1].legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _save_panels(plt, fig, axes, len(panels), "perplexity (lower is better)",
                        "Perplexity vs length (a colour a lever; TAPA globals solid, NoPE globals dashed; "
                        "mean over the seeds named)", path)


def plot_retrieval(rows: list[dict], path: Path) -> Path | None:
    tasks = list(dict.fromkeys(r["task"] for r in rows))
    if not tasks:
        return None
    plt, fig, axes, arms, style = _line_panels(rows, len(tasks))
    for ax, task in zip(axes.flat, tasks):
        counts = pooled(rows, task)
        for arm in arms:
            lengths = sorted(n for a, n in counts if a == arm)
            if not lengths:
                continue
            acc = [counts[(arm, n)][0] / counts[(arm, n)][1] for n in lengths]
            bounds = [wilson_interval(*counts[(arm, n)]) for n in lengths]
            ax.errorbar(lengths, [100 * a for a in acc],
                        yerr=[[max(0.0, 100 * (a - lo)) for a, (lo, _) in zip(acc, bounds)],
                              [max(0.0, 100 * (hi - a)) for a, (_, hi) in zip(acc, bounds)]],
                        capsize=2, **style(arm))
        ax.set(xscale="log", ylim=(-3, 103), title=task, xlabel="prompt length (tokens)")
        lengths = sorted({n for _, n in counts})
        ax.set_xticks(lengths, [length_label(n) for n in lengths])
        ax.minorticks_off()
        ax.grid(True, alpha=0.3)
    axes.flat[len(tasks) - 1].legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _save_panels(plt, fig, axes, len(tasks), "% correct, needle beyond the window",
                        "Retrieval beyond the local window after the continual stage (the named seeds "
                        "pooled; 95% Wilson intervals)",
                        path)


def plot_seeds(ppl: list[dict], retrieval: list[dict], path: Path) -> Path | None:
    """A panel per deciding measure (`_measures`): each seed's value as a dot, a column per arm with
    2 or more seeds, its mean as a bar: where the seed spread lies against the arms' difference.
    None when no arm has 2 seeds."""
    values = _per_seed(ppl, retrieval)
    seeds, _ = _seeded(values, ppl, retrieval, 2)
    arms = [arm for arm in _arms(ppl + retrieval) if len(seeds[arm]) >= 2]
    if not arms:
        return None
    measures = _measures(ppl, retrieval)
    plt = _pyplot()
    fig, axes = _panel_grid(plt, len(measures))
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, measure in zip(axes.flat, measures):
        for i, arm in enumerate(arms):
            by_seed = values.get((arm, measure), {})
            if not by_seed:
                continue
            ys = [by_seed[k] for k in sorted(by_seed)]
            ax.scatter([i] * len(ys), ys, color=cycle[i % len(cycle)], s=18, zorder=3)
            for k, y in zip(sorted(by_seed), ys):
                ax.annotate(str(k), (i, y), xytext=(4, 0), textcoords="offset points", fontsize=6,
                            va="center")
            ax.hlines(sum(ys) / len(ys), i - 0.25, i + 0.25, color=cycle[i % len(cycle)], linewidth=2)
        ax.set_xticks(range(len(arms)), arms, rotation=30, ha="right", fontsize=7)
        ax.set_xlim(-0.6, len(arms) - 0.4)
        ax.set_title(measure + ("" if "ppl" in measure else ", beyond the window"), fontsize=9)
        ax.grid(True, axis="y", alpha=0.3)
    return _save_panels(plt, fig, axes, len(measures), "perplexity, or % correct",
                        "Each seed (dot, labelled) and the mean (bar), for the arms with 2+ seeds; "
                        "continual stage", path)


def label_spots(points: list[tuple[float, float]], width: float = 0.16, height: float = 0.03,
                top: float = 0.95) -> list[tuple[float, float]]:
    """Where to write a name beside each point (axes fractions, in the given order): at the
    point's height if free, else the nearest free step of `height` below or above it within the
    axes, where free means no name already placed within `width` across and `height` up or down.
    Crowded points keep the spot least far off when no step is free."""
    steps = [0.0] + [sign * k * height for k in range(1, int(1 / height) + 1) for sign in (-1, 1)]
    placed = []
    for u, v in points:
        inside = [v + d for d in steps if 0.0 <= v + d <= top] or [min(max(v, 0.0), top)]
        spot = next((w for w in inside
                     if not any(abs(u - pu) < width and abs(w - pv) < height for pu, pv in placed)),
                    inside[0])
        placed.append((u, spot))
    return placed


def tradeoff_points(ppl: list[dict], retrieval: list[dict], min_seeds: int = 1) -> tuple:
    """(x measure, y measure, {arm: [(x, y) per seed]}) for the tradeoff plot: test perplexity at
    the longest length and retrieval beyond the window at the second-longest prompt (multi-key,
    else the first suite task run), after the continual stage, for each arm with both measures on
    at least min_seeds seeds; RoPE + YaRN and the two bases with any. No arms when none has both,
    or when a min_seeds above 1 leaves only those references."""
    measures = _measures(ppl, retrieval)
    x_measure = next((m for m in reversed(measures) if m.startswith("test ppl")), None)
    tasks = [m.rsplit(" ", 1)[0] for m in measures if " ppl " not in m]
    task = "multi-key" if "multi-key" in tasks else next(iter(tasks), None)
    y_measure = next((m for m in measures if m.startswith(f"{task} ")), None) if task else None
    if not x_measure or not y_measure:
        return x_measure, y_measure, {}
    values = _per_seed(ppl, retrieval)
    points = {}
    for arm in _arms(ppl + retrieval):
        xs, ys = values.get((arm, x_measure), {}), values.get((arm, y_measure), {})
        seeds = sorted(set(xs) & set(ys))
        if seeds and (len(seeds) >= min_seeds or _is_reference(arm)):
            points[arm] = [(xs[k], ys[k]) for k in seeds]
    if min_seeds > 1 and not any(len(p) >= min_seeds and not _is_reference(a) for a, p in points.items()):
        points = {}  # no lever has the seeds yet: nothing to set beside the references
    return x_measure, y_measure, points


def plot_tradeoff(ppl: list[dict], retrieval: list[dict], path: Path, min_seeds: int = 1) -> Path | None:
    """The screen's two deciding measures against each other (`tradeoff_points`). A small mark
    per seed, a large one at each arm's mean, named; one colour a lever, TAPA circles, NoPE
    squares, anchors triangles. With min_seeds, only the arms with that many seeds, beside RoPE +
    YaRN and the two bases. None when there are no arms to show."""
    x_measure, y_measure, per_arm = tradeoff_points(ppl, retrieval, min_seeds)
    if not per_arm:
        return None
    plt = _pyplot()
    colours = _lever_colours(plt, _arms(ppl + retrieval))  # an arm's colour is the same in every plot
    fig, ax = plt.subplots(figsize=(8.5, 6))
    means = {}
    for arm, points in per_arm.items():
        marker = {"tapa": "o", "nope": "s"}.get(global_kind(arm), "^")
        ax.scatter(*zip(*points), color=colours[arm], marker=marker, s=14, alpha=0.45)
        means[arm] = (mean(x for x, _ in points), mean(y for _, y in points), len(points))
        ax.scatter(*means[arm][:2], color=colours[arm], marker=marker, s=70, edgecolors="black",
                   linewidths=0.6, zorder=3)
    (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
    order = sorted(means, key=lambda arm: -means[arm][1])
    marks = [((means[a][0] - x0) / (x1 - x0), (means[a][1] - y0) / (y1 - y0)) for a in order]
    for arm, mark, (u, v) in zip(order, marks, label_spots(marks)):
        x, y, n = means[arm]
        ax.annotate(f"{arm.removeprefix('hybrid-')} ({n})", (x, y), xytext=(u + 0.008, v + 0.008),
                    textcoords="axes fraction", fontsize=7,  # a name moved off its mark points at it
                    arrowprops=dict(arrowstyle="-", lw=0.4, color="grey", shrinkA=0) if (u, v) != mark else None)
    ax.set(xlabel=f"{x_measure.replace('test ppl', 'test perplexity at')} (lower is better)",
           ylabel=f"{y_measure}: % correct beyond the window (higher is better)")
    ax.grid(True, alpha=0.3)
    which = (f"the arms with {min_seeds}+ seeds, beside RoPE + YaRN and the bases\n" if min_seeds > 1 else "")
    ax.set_title("Length against retrieval after the continual stage: up and to the left is better\n"
                 f"{which}(large mark: the mean over the seeds in brackets, small: each seed; TAPA "
                 "circles, NoPE squares, a colour a lever)", fontsize=9)
    fig.tight_layout()
    save_png(fig, path, dpi=120)
    plt.close(fig)
    return path


def plot_heatmap(rows: list[dict], path: Path) -> Path | None:
    tasks = list(dict.fromkeys(r["task"] for r in rows))
    if not tasks:
        return None
    plt = _pyplot()
    arms = _arms(rows)
    lengths = sorted({r["length"] for r in rows})
    means = _mean_by([r for r in rows if r["far_trials"]], ("arm", "task", "length"), "far_accuracy")
    fig, axes = plt.subplots(1, len(tasks), figsize=(2.2 + 1.1 * len(lengths) * len(tasks),
                                                     1.2 + 0.32 * len(arms)), squeeze=False)
    for column, (ax, task) in enumerate(zip(axes[0], tasks)):
        grid = [[means.get((arm, task, n), math.nan) for n in lengths] for arm in arms]
        image = ax.imshow([[100 * v for v in row] for row in grid], vmin=0, vmax=100,
                          cmap="viridis", aspect="auto")
        for i, row in enumerate(grid):
            for j, value in enumerate(row):
                if value == value:
                    ax.text(j, i, f"{100 * value:.0f}", ha="center", va="center", fontsize=6,
                            color="white" if value < 0.6 else "black")
        ax.set_xticks(range(len(lengths)), [length_label(n) for n in lengths], fontsize=7)
        ax.set_yticks(range(len(arms)), arms if column == 0 else [""] * len(arms), fontsize=7)
        ax.set_title(task, fontsize=9)
    fig.colorbar(image, ax=axes[0].tolist(), shrink=0.8, label="% correct")
    fig.suptitle("Retrieval beyond the local window, by arm and prompt length (mean over seeds)", fontsize=10,
                 y=1.08)
    save_png(fig, path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


def screen(paths, out_dir: str | Path, command: str, arms: list[str] | None = None,
           seeds: list[int] | None = None, anchors=()) -> list[Path]:
    """The screen's tables and plots from the jobs in `paths`, with the RoPE + YaRN anchor's jobs
    (arm `rope-yarn`, the screen's protocols) taken from `anchors` as well (a job met twice counts
    once)."""
    jobs = screen_jobs(paths)
    if anchors:
        seen = {(j["protocol_id"], j["job"]) for j in jobs}
        extra = [j for j in load_jobs(anchors)
                 if j["arm"] == ANCHOR and j["protocol"]["name"] in PROTOCOL_TAGS
                 and (j["protocol_id"], j["job"]) not in seen]
        if not extra and not any(j["arm"] == ANCHOR for j in jobs):
            raise ValueError(f"no {ANCHOR} job of the screen protocols in {[str(a) for a in anchors]}")
        jobs += extra
    if arms:
        jobs = [j for j in jobs if arm_id(j) in arms]
        if not jobs:
            raise ValueError(f"none of the arms {arms} has a job in the inputs")
    if seeds is not None:
        jobs = [j for j in jobs if j["seed"] in seeds]
        if not jobs:
            raise ValueError(f"no job of the seeds {seeds} in the inputs")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    readings = jobs + plain_twins(jobs)  # the tables' rows; the progress table reads the jobs
    ppl = perplexity_rows(readings)
    retrieval, cells = retrieval_rows(readings)
    written = []
    for name, rows in (("perplexity.csv", ppl), ("retrieval.csv", retrieval),
                       ("retrieval_cells.csv", cells)):
        if rows:
            write_csv(out / name, rows)
            written.append(out / name)
    hardware = sorted({h for j in jobs for h in j.get("hardware", [])})
    lengths = {j["protocol"].get("pretrain_len") for j in jobs
               if PROTOCOL_TAGS[j["protocol"]["name"]] not in SCALE_TAGS}
    pretrain_len = lengths.pop() if len(lengths) == 1 else None  # the toy screen's, when one
    dates = sorted(j["date"] for j in jobs)
    domains = {(d["domain"], d["files"], d["bytes"], d["sha256"][:12])
               for j in jobs if (d := (j.get("corpus") or {}).get("domain"))}
    domain_line = "; ".join(f"second domain {name}: {files} files, {size:,} bytes, sha256 {sha}"
                            for name, files, size, sha in sorted(domains))
    reached = reach(ppl, retrieval)  # the TAPA arms short of three seeds: can they still meet the goal
    sections = [f"Generated by `{command}` from {len(jobs)} job JSONs "
                f"({', '.join(sorted({j['protocol']['name'] for j in jobs}))}); hardware: "
                f"{'; '.join(hardware) or 'unknown'}; jobs dated {dates[0][:10]} to "
                f"{dates[-1][:10]}" + (f"; {domain_line}." if domain_line else "."),
                goal_table(ppl, retrieval, pretrain_len),
                reach_table(reached),
                summary_table(ppl, retrieval, pretrain_len),
                # the whole screen's only
                "" if arms or seeds is not None else progress_table(
                    jobs, {arm: why for arm, (_, why) in reached.items() if why}),
                lever_table(ppl, retrieval), kind_table(ppl, retrieval), seed_table(ppl, retrieval)]
    sections += [perplexity_table(ppl, s, d) for s in ("continual", "zero-shot") for d in ("test", "domain")]
    for task in dict.fromkeys(r["task"] for r in retrieval):  # empty sections are left out below
        sections += [retrieval_table(retrieval, task), recall_table(retrieval, task)]
    # the pretrained globals' logit decay, one row per arm as the tables above name it: the same
    # arm and seed under two protocols (30M and 91M) are two runs, not one
    named = [{**job, "arm": arm_id(job), "label": _label(job)} for job in jobs]
    sections.append(theory_markdown(theory_rows(named), named))
    plots = [plot_perplexity(ppl, out / "perplexity.png"), plot_retrieval(retrieval, out / "retrieval.png"),
             plot_heatmap(retrieval, out / "retrieval_heatmap.png"),
             plot_seeds(ppl, retrieval, out / "seeds.png"),
             plot_tradeoff(ppl, retrieval, out / "tradeoff.png"),
             plot_tradeoff(ppl, retrieval, out / f"tradeoff_seeds{GOAL_SEEDS}.png", min_seeds=GOAL_SEEDS)]
    sections += [f"![{p.stem}]({p.name})" for p in plots if p]
    (out / "screen.md").write_text("\n\n".join(s for s in sections if s) + "\n")
    return written + [out / "screen.md"] + [p for p in plots if p]


def keep_jobs(archives, folder: str | Path) -> list[Path]:
    """Copy the job JSONs of each runner archive (study-PROTOCOL-CALL.tar.gz) into
    FOLDER/jobs-CALL.tar.gz, without the archive's logs and tokenizer, so that a screen spread over
    sessions aggregates every call from the tree. Byte-stable: a second copy rewrites nothing."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for archive in map(Path, archives):
        if not archive.name.startswith("study-") or not archive.name.endswith(".tar.gz"):
            raise ValueError(f"{str(archive)!r} is not a runner archive (study-PROTOCOL-CALL.tar.gz)")
        with tarfile.open(archive) as tar:
            members = sorted((m for m in tar.getmembers() if m.isfile() and m.name.endswith(".job.json")),
                             key=lambda m: m.name)
            files = [(Path(m.name).name, tar.extractfile(m).read()) for m in members]
        if not files:
            raise ValueError(f"{str(archive)!r} holds no job JSONs")
        call = "-".join(archive.name[:-len(".tar.gz")].split("-")[-3:])  # DATE-TIME-PID
        buffer = io.BytesIO()
        with gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0) as gz, \
                tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for name, data in files:
                info = tarfile.TarInfo(f"jobs/{name}")
                info.size, info.mode = len(data), 0o644
                tar.addfile(info, io.BytesIO(data))
        target = folder / f"jobs-{call}.tar.gz"
        if not target.exists() or target.read_bytes() != buffer.getvalue():
            target.write_bytes(buffer.getvalue())
        written.append(target)
    return written


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m lab.study.screen", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--in", dest="inputs", nargs="+", required=True,
                        help="folders, *.job.json files or the runner's .tar.gz archives")
    parser.add_argument("--out", default="results/toy-study/globals")
    parser.add_argument("--arms", default=None,
                        help="comma-separated arms (ARM or ARM@c4096) to report; default: all")
    parser.add_argument("--seeds", default=None,
                        help="comma-separated seeds to report (e.g. 0, where the other arms of a "
                             "table ran one seed); default: all")
    parser.add_argument("--anchors", nargs="+", default=[], metavar="PATH",
                        help=f"job folders or archives from which the RoPE + YaRN anchor's jobs "
                             f"({ANCHOR}) are read too, for the goal's length criterion "
                             "(results/retrofit/toy-gpu/jobs holds the toy screen's)")
    parser.add_argument("--keep-jobs", metavar="FOLDER",
                        help="first copy the job JSONs of each runner archive among --in into "
                             "FOLDER/jobs-CALL.tar.gz (the screen's record in the tree)")
    args = parser.parse_args(argv)
    if args.keep_jobs:
        archives = [p for p in args.inputs if p.endswith(".tar.gz")]
        try:
            kept = keep_jobs(archives, args.keep_jobs)
        except (ValueError, OSError, tarfile.TarError) as err:
            raise SystemExit(f"lab.study.screen: {err}") from err
        print(f"kept the job JSONs of {len(kept)} archives in {args.keep_jobs}")
    arms = args.arms.split(",") if args.arms else None
    try:
        seeds = [int(seed) for seed in args.seeds.split(",")] if args.seeds else None
    except ValueError:
        raise SystemExit(f"lab.study.screen: --seeds takes comma-separated integers, "
                         f"not {args.seeds!r}") from None
    command = (f"python3 -m lab.study.screen --in {' '.join(args.inputs)} --out {args.out}"
               + (f" --anchors {' '.join(args.anchors)}" if args.anchors else "")
               + (f" --arms {args.arms}" if arms else "") + (f" --seeds {args.seeds}" if seeds else ""))
    try:
        written = screen(args.inputs, args.out, command, arms, seeds, args.anchors)
    except ValueError as err:
        raise SystemExit(f"lab.study.screen: {err}") from err
    print(f"wrote {len(written)} files to {args.out}: " + ", ".join(p.name for p in written))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
