"""A retrieval suite beyond the passkey: four needle-in-a-haystack task families (after the task
families of RULER, Hsieh et al. 2024, written here from scratch), generated from filler text.

    single-key         one needle "The special magic number for KEY is VALUE." in the filler; the
                       question asks for KEY's number.
    multi-key          the same needle among `distractors` (default 3) needles of other keys and
                       numbers; the question asks for one key's number.
    multi-value        `values` (default 4) needles "One of the special magic numbers for KEY is
                       VALUE." of one key; the answer must hold every value (in any order).
    variable-tracking  `chains` (default 2) chains of `hops` (default 4) assignments "VAR ABCDE =
                       12345." "VAR FGHIJ = ABCDE." ...; the question asks which variables hold
                       the first chain's value; the answer must name exactly that chain's
                       variables (in any order).

Where the needles go (depth d of the grid; filler offsets rounded to a token, as the passkey's):
- single-key: the needle at depth d;
- multi-key: the asked needle at d, the distractors at seeded uniform random depths;
- multi-value: value j of n at depth d + (1 - d) * j / n (the first at d, the rest spread to the end);
- variable-tracking: the asked chain's hop j at d + (1 - d) * j / hops, every other chain at sorted
  seeded random depths (each chain is always read in assignment order).

Values are random 5-digit numbers (first digit non-zero, all distinct in a prompt), keys two words
joined by a hyphen ("amber-falcon"), variables five random capital letters. single-key keeps the
passkey's shape (the passkey's instruction, a needle sentence naming the number, a question
ending in "... is" so that the answer is " NNNNN"), so that models trained with --passkey-fraction
meet a familiar format.

Scoring: the model decodes greedily as many tokens as the reference answer has; the answer is
right when its items (words between spaces, commas and periods) are exactly the expected ones
(`tapa.eval.passkey_eval.matches_answer`). Each grid also holds the item recall per cell: the share
of the expected items the answer names, whatever else it holds (`item_recall`; RULER's score for
multi-value and variable tracking). An answer that names one of four values scores 0 in accuracy
and 0.25 in recall, so recall still moves where exact answers are out of a small model's reach.

Trials and intervals. A cell of n trials estimates an accuracy p with a 95% interval of half-width
about 1.96 * sqrt(p (1 - p) / n); at p = 0.5 (the worst case) a half-width of 5 points needs
n = 1.96^2 * 0.25 / 0.05^2 = 385 trials (`trials_for_half_width`). That many per cell is too slow
for a grid, so the default is ceil(385 / depths) trials per cell: 77 with the 5 default depths,
+-5 points on each length's aggregate over depths and about +-11 points per cell. Tables give the
Wilson score interval (`wilson_interval`), which stays inside [0, 1] for small n and for
accuracies near 0 or 1.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from tapa.data.passkey import INSTRUCTION as PASSKEY_INSTRUCTION
from tapa.data.passkey import build_needle_prompt, random_passkey
from tapa.eval.passkey_eval import (DEFAULT_DEPTHS, RETRIEVAL_BATCH_TOKENS, answer_items, item_recall,
                                    matches_answer, needle_grid, trial_filler)

TASKS = ("single-key", "multi-key", "multi-value", "variable-tracking")
SEVERAL_ITEMS = ("multi-value", "variable-tracking")  # tasks whose answer lists several items
Z95 = 1.959963984540054  # the 0.975 quantile of the standard normal
TARGET_HALF_WIDTH = 0.05

KV_NEEDLE = " The special magic number for {key} is {value}."
KV_QUESTION = " What is the special magic number for {key}? The special magic number for {key} is"
MV_NEEDLE = " One of the special magic numbers for {key} is {value}."
MV_QUESTION = (" What are all the special magic numbers for {key}? The special magic numbers for {key} "
               "are")
VT_INSTRUCTION = ("Memorize and track the chains of variable assignments hidden in the following text. "
                  "I will ask you which variables end up holding a value.")
VT_FIRST = " VAR {name} = {value}."
VT_NEXT = " VAR {name} = {previous}."
VT_QUESTION = " Which variables are assigned the value {value}? The variables assigned {value} are"

_ADJECTIVES = ("amber", "brave", "calm", "dusty", "eager", "faint", "gentle", "hollow", "icy", "jolly",
               "keen", "lucky", "misty", "noble", "olive", "proud", "quiet", "rapid", "silent", "tidy",
               "upper", "vivid", "wild", "young", "zesty", "bold", "crisp", "deep", "early", "fresh",
               "golden", "humble")
_NOUNS = ("falcon", "river", "lantern", "meadow", "harbor", "pebble", "thistle", "compass", "orchard",
          "beacon", "canyon", "ember", "glacier", "island", "jasmine", "kettle", "ladder", "marble",
          "needle", "otter", "parcel", "quarry", "ribbon", "saddle", "tunnel", "violet", "walnut",
          "willow", "anchor", "bridge", "candle", "dragon")


@dataclass
class TaskSettings:
    """The sizes of the task families (see the module docstring)."""

    distractors: int = 3  # multi-key: needles of other keys beside the asked one
    values: int = 4  # multi-value: values of the one key
    hops: int = 4  # variable-tracking: assignments per chain (the first binds the value)
    chains: int = 2  # variable-tracking: chains in the prompt, the asked one included

    def __post_init__(self):
        for name, low in (("distractors", 1), ("values", 2), ("hops", 1), ("chains", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        if self.distractors >= len(_ADJECTIVES) * len(_NOUNS):
            raise ValueError(f"distractors must be below {len(_ADJECTIVES) * len(_NOUNS)}")

    def of(self, task: str) -> dict:
        """The settings a task reads (recorded with its grid)."""
        return {"single-key": {}, "multi-key": {"distractors": self.distractors},
                "multi-value": {"values": self.values},
                "variable-tracking": {"hops": self.hops, "chains": self.chains}}[task]

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class TaskPrompt:
    """A task prompt of exactly `len(ids)` tokens and its reference answer."""

    task: str
    ids: list[int]
    answer_ids: list[int]  # the reference answer's tokens (the model decodes this many)
    answer: str  # the reference answer's text, e.g. " 40713" or " 40713, 12345"
    expected: list[str]  # the items a right answer holds
    ordered: bool  # whether they must come in that order
    needles: list[str]  # the needle texts; needles[0] is the asked one (its first, for chains)
    needle_positions: list[int]  # where each needle starts in ids
    depth: float
    n_filler: int  # filler tokens in the prompt
    question: str


def parse_tasks(text: str) -> tuple[str, ...]:
    """'all' or a comma-separated list of task names; ValueError naming the unknown ones."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    if names == ["all"]:
        return TASKS
    bad = [name for name in names if name not in TASKS]
    if bad or not names:
        raise ValueError(f"unknown retrieval task(s) {bad or [text]}; choose from {', '.join(TASKS)} or 'all'")
    return tuple(dict.fromkeys(names))


def trials_for_half_width(half_width: float = TARGET_HALF_WIDTH, p: float = 0.5, z: float = Z95) -> int:
    """Trials for a normal-approximation interval of +-half_width at accuracy p: ceil(z^2 p (1-p) /
    half_width^2); 385 for +-5 points at p = 0.5."""
    return math.ceil(z * z * p * (1.0 - p) / (half_width * half_width))


def default_trials(n_depths: int) -> int:
    """Trials per cell so that each length's aggregate over `n_depths` depths is +-5 points."""
    return math.ceil(trials_for_half_width() / max(1, n_depths))


def wilson_interval(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval (95% by default) of a proportion successes / n."""
    if n <= 0:
        return 0.0, 1.0
    p = successes / n
    denominator = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    spread = z * math.sqrt(p * (1.0 - p) / n + z * z / (4 * n * n)) / denominator
    return max(0.0, centre - spread), min(1.0, centre + spread)


def beyond_window(length: int, depth: float, window: int) -> bool:
    """Whether a needle at `depth` of a `length`-token prompt lies more than `window` tokens before
    the question. The filler is the prompt less a few dozen tokens of instruction, needle and
    question, so (1 - depth) * length is the distance to within those. In a hybrid model a needle
    inside the local layers' window can be copied by them; one beyond it only through the global
    layers, which is what a length test of the global layers should count."""
    return (1.0 - depth) * length > window


def _distinct_values(rng: np.random.Generator, count: int) -> list[str]:
    values: list[str] = []
    while len(values) < count:
        value = random_passkey(rng)
        if value not in values:
            values.append(value)
    return values


def _distinct_keys(rng: np.random.Generator, count: int) -> list[str]:
    keys: list[str] = []
    while len(keys) < count:
        key = f"{_ADJECTIVES[int(rng.integers(len(_ADJECTIVES)))]}-{_NOUNS[int(rng.integers(len(_NOUNS)))]}"
        if key not in keys:
            keys.append(key)
    return keys


def _distinct_names(rng: np.random.Generator, count: int) -> list[str]:
    names: list[str] = []
    while len(names) < count:
        name = "".join(chr(ord("A") + int(c)) for c in rng.integers(0, 26, size=5))
        if name not in names:
            names.append(name)
    return names


def _spread(depth: float, count: int) -> list[float]:
    """The first at `depth`, the rest evenly towards the end: depth + (1 - depth) * j / count."""
    return [depth + (1.0 - depth) * j / count for j in range(count)]


def _task_pieces(task: str, depth: float, rng: np.random.Generator, settings: TaskSettings):
    """(instruction, [(depth, needle text)], question, expected items, ordered) of one prompt."""
    if task == "single-key":
        [key], [value] = _distinct_keys(rng, 1), _distinct_values(rng, 1)
        return (PASSKEY_INSTRUCTION, [(depth, KV_NEEDLE.format(key=key, value=value))],
                KV_QUESTION.format(key=key), [value], True)
    if task == "multi-key":
        count = 1 + settings.distractors
        keys, values = _distinct_keys(rng, count), _distinct_values(rng, count)
        depths = [depth] + [float(d) for d in rng.uniform(0.0, 1.0, size=settings.distractors)]
        needles = [(d, KV_NEEDLE.format(key=k, value=v)) for d, k, v in zip(depths, keys, values)]
        return PASSKEY_INSTRUCTION, needles, KV_QUESTION.format(key=keys[0]), [values[0]], True
    if task == "multi-value":
        [key], values = _distinct_keys(rng, 1), _distinct_values(rng, settings.values)
        needles = [(d, MV_NEEDLE.format(key=key, value=v)) for d, v in zip(_spread(depth, len(values)), values)]
        return PASSKEY_INSTRUCTION, needles, MV_QUESTION.format(key=key), values, False
    if task == "variable-tracking":
        values = _distinct_values(rng, settings.chains)
        names = _distinct_names(rng, settings.chains * settings.hops)
        chains = [names[c * settings.hops:(c + 1) * settings.hops] for c in range(settings.chains)]
        needles = []
        for c, (chain, value) in enumerate(zip(chains, values)):
            depths = (_spread(depth, settings.hops) if c == 0
                      else sorted(float(d) for d in rng.uniform(0.0, 1.0, size=settings.hops)))
            for hop, (d, name) in enumerate(zip(depths, chain)):
                text = (VT_FIRST.format(name=name, value=value) if hop == 0
                        else VT_NEXT.format(name=name, previous=chain[hop - 1]))
                needles.append((d, text))
        return VT_INSTRUCTION, needles, VT_QUESTION.format(value=values[0]), chains[0], False
    raise ValueError(f"unknown retrieval task {task!r}; choose from {', '.join(TASKS)}")


def build_task_prompt(task: str, encode, *, length: int, depth: float, rng: np.random.Generator,
                      settings: TaskSettings | None = None, filler_ids=None) -> TaskPrompt:
    """One prompt of `task` of exactly `length` tokens, its asked needle at `depth`; keys, values,
    names and distractor depths are drawn from `rng`, then the filler window (`trial_filler`).
    filler_ids: corpus tokens (a seeded window, tiled when short); None: the standard sentences."""
    instruction, needles, question, expected, ordered = _task_pieces(task, depth, rng, settings or TaskSettings())
    answer = " " + (", ".join(expected) if task == "multi-value" else " ".join(expected))
    ids, positions, n_filler = build_needle_prompt(
        encode, length=length, instruction=instruction, needles=needles, question=question,
        filler_ids=trial_filler(filler_ids, length, rng), what=f"{task} prompt")
    return TaskPrompt(task=task, ids=ids, answer_ids=list(encode(answer)), answer=answer,
                      expected=list(expected), ordered=ordered, needles=[text for _, text in needles],
                      needle_positions=positions, depth=float(depth), n_filler=n_filler, question=question)


def judge_task(prompt: TaskPrompt, generated_ids, decode) -> tuple[bool, float]:
    """(right, item recall) of the greedy answer, its first len(answer_ids) tokens decoded once:
    exact match to the expected items, in order for single- and multi-key, in any order for
    multi-value and variable-tracking (`matches_answer`); and the share of the expected items it
    names, in any order (`item_recall`)."""
    text = decode([int(t) for t in generated_ids[:len(prompt.answer_ids)]])
    return (matches_answer(text, prompt.expected, ordered=prompt.ordered),
            item_recall(text, prompt.expected))


def score_task(prompt: TaskPrompt, generated_ids, decode) -> bool:
    """Exact match of the greedy answer to the expected items (`judge_task`)."""
    return judge_task(prompt, generated_ids, decode)[0]


def minimum_length(task: str, encode, settings: TaskSettings | None = None, samples: int = 16) -> int:
    """The fewest tokens a prompt of `task` needs with this tokenizer (instruction, needles and
    question; the largest of `samples` seeded draws), to check the lengths before a long run."""
    rng = np.random.default_rng(12345)
    settings = settings or TaskSettings()
    sizes = []
    for _ in range(samples):
        instruction, needles, question, _, _ = _task_pieces(task, 0.5, rng, settings)
        needle_tokens = sum(len(encode(text)) for _, text in needles)
        sizes.append(len(encode(instruction)) + needle_tokens + len(encode(question)))
    return max(sizes)


def check_task_lengths(tasks, encode, lengths, settings: TaskSettings | None = None, *,
                       train_len: int | None = None) -> None:
    """ValueError when a length is too short for a task's fixed text. train_len: the lengths are
    the default ones, 1x-8x this training length (the message then names no flag the user gave)."""
    for task in tasks:
        needed = minimum_length(task, encode, settings)
        short = sorted(n for n in lengths if n < needed)
        if not short:
            continue
        what = (f"the default task lengths (1x, 2x, 4x and 8x the training length {train_len}) include "
                f"{','.join(map(str, short))}, too short" if train_len else
                f"--task-lengths {','.join(map(str, short))} too short")
        remedy = (f"{'pass --task-lengths' if train_len else 'use lengths'} of at least {needed} (better "
                  "several times that)")
        tail = "" if train_len else ("; without --task-lengths the lengths are 1x, 2x, 4x and 8x the "
                                     "training length")
        raise ValueError(f"{what} for {task}: its instruction, needles and question take up to {needed} "
                         f"tokens with this tokenizer; {remedy}{tail}")


TASK_SEEDS = {task: index + 1 for index, task in enumerate(TASKS)}  # passkey grids use no task index


def task_grid(model, task: str, encode, decode, *, lengths, depths=DEFAULT_DEPTHS, trials: int | None = None,
              seed: int = 0, filler_ids=None, settings: TaskSettings | None = None,
              train_len: int | None = None, batch_tokens: int | None = RETRIEVAL_BATCH_TOKENS,
              prefill_chunk: int | None = None,
              progress: bool = True, label: str | None = None, filler_name: str | None = None) -> dict:
    """Accuracy of `task` on every (length, depth) cell (`needle_grid`), `trials` seeded prompts per
    cell (default: `default_trials(len(depths))`), and the item recall per cell (`judge_task`).
    filler_ids: corpus tokens for the filler; None uses the standard sentences. Returns the grid
    dict plus task, settings, seed, filler and an example prompt's question and answer."""
    settings = settings or TaskSettings()
    trials = default_trials(len(depths)) if trials is None else trials

    def make_prompt(rng, length, depth):
        return build_task_prompt(task, encode, length=length, depth=depth, rng=rng, settings=settings,
                                 filler_ids=filler_ids)

    def example(prompt, output):
        text = decode(output[:len(prompt.answer_ids)])
        return {"expected": prompt.expected, "output": text, "items": answer_items(text)}

    grid = needle_grid(model, make_prompt, lambda prompt, output: judge_task(prompt, output, decode),
                       lengths=lengths, depths=depths, trials=trials, seed=[seed, TASK_SEEDS[task]],
                       train_len=train_len, prefill_chunk=prefill_chunk, batch_tokens=batch_tokens,
                       progress=progress, desc=f"{label or model.config.pe} {task}", example=example)
    return {"task": task, **grid, "seed": seed, "settings": settings.of(task),
            "filler": filler_name or ("standard" if filler_ids is None else "corpus")}


__all__ = ["SEVERAL_ITEMS", "TASKS", "TaskSettings", "TaskPrompt", "build_task_prompt", "check_task_lengths",
           "default_trials", "judge_task", "minimum_length", "parse_tasks", "score_task",
           "task_grid", "trials_for_half_width", "wilson_interval"]
