"""The retrieval suite (tapa.eval.tasks): each task's prompt holds exactly its needles, the asked one
at the requested depth; the scorer accepts right answers and refuses wrong ones; the grid runs on a
stub that reads its context; the trial count and Wilson intervals are what the docs say."""

import re
from types import SimpleNamespace

import numpy as np
import pytest

from tapa.data.passkey import INSTRUCTION
from tapa.eval.passkey_eval import item_recall, matches_answer
from tapa.eval.report import grid_table
from tapa.eval.tasks import (TASKS, VT_INSTRUCTION, TaskSettings, beyond_window, build_task_prompt,
                             check_task_lengths, default_trials, judge_task, minimum_length, parse_tasks,
                             score_task, task_grid, trials_for_half_width, wilson_interval)

from helpers import ContextReader, WordTokenizer, char_decode, char_encode


KV = re.compile(r"The special magic number for ([a-z]+-[a-z]+) is (\d{5})\.")
MV = re.compile(r"One of the special magic numbers for ([a-z]+-[a-z]+) is (\d{5})\.")
VAR = re.compile(r"VAR ([A-Z]{5}) = (\d{5}|[A-Z]{5})\.")


def resolve(assignments, name):
    """The value a variable ends up holding through a chain of VAR assignments."""
    value = assignments[name]
    return value if value.isdigit() else resolve(assignments, value)


SETTINGS = TaskSettings(distractors=3, values=4, hops=3, chains=2)
DEPTHS = [0.0, 0.25, 0.5, 1.0]


@pytest.mark.parametrize("make_encode", [lambda: char_encode, lambda: WordTokenizer().encode],
                         ids=["chars", "words"])
@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("depth", DEPTHS)
def test_prompt_holds_exactly_its_needles_the_asked_one_at_depth(make_encode, task, depth):
    encode = make_encode()
    length = 1500 if encode is char_encode else 600
    rng = np.random.default_rng([7, int(depth * 100)])
    prompt = build_task_prompt(task, encode, length=length, depth=depth, rng=rng, settings=SETTINGS)
    assert len(prompt.ids) == length and prompt.n_filler > 0
    text = " ".join(prompt.needles)
    instruction = VT_INSTRUCTION if task == "variable-tracking" else INSTRUCTION
    assert prompt.ids[:len(encode(instruction))] == encode(instruction)
    assert prompt.ids[-len(encode(prompt.question)):] == encode(prompt.question)
    # every needle sits intact where the prompt says it starts
    for needle, start in zip(prompt.needles, prompt.needle_positions):
        assert prompt.ids[start:start + len(encode(needle))] == encode(needle)
    # exactly the needles of the task, and the answer they imply
    if task in ("single-key", "multi-key"):
        found = KV.findall(text)
        assert len(found) == (1 if task == "single-key" else 1 + SETTINGS.distractors)
        assert len({key for key, _ in found}) == len(found)  # one needle per key
        asked = re.search(r"What is the special magic number for ([a-z]+-[a-z]+)\?", prompt.question).group(1)
        assert [value for key, value in found if key == asked] == prompt.expected
        assert not MV.findall(text) and not VAR.findall(text)
    elif task == "multi-value":
        found = MV.findall(text)
        assert len(found) == SETTINGS.values and len({key for key, _ in found}) == 1
        assert sorted(value for _, value in found) == sorted(prompt.expected)
        assert len(set(prompt.expected)) == SETTINGS.values and not KV.findall(text)
    else:
        found = VAR.findall(text)
        assert len(found) == SETTINGS.chains * SETTINGS.hops
        assignments = dict(found)
        value = re.search(r"assigned the value (\d{5})\?", prompt.question).group(1)
        holders = [name for name in assignments if resolve(assignments, name) == value]
        assert sorted(holders) == sorted(prompt.expected) and len(holders) == SETTINGS.hops
        # each chain is assigned in order: a variable's source comes before it in the prompt
        order = sorted(range(len(found)), key=lambda j: prompt.needle_positions[j])
        seen = set()
        for j in order:
            name, source = found[j]
            assert source.isdigit() or source in seen
            seen.add(name)
    # the asked needle (the first of a chain or of the values) after round(depth * filler) filler tokens
    target = prompt.needle_positions[0]
    before = sum(len(encode(n)) for n, s in zip(prompt.needles, prompt.needle_positions) if s < target)
    filler_before = target - len(encode(instruction)) - before
    assert abs(filler_before - depth * prompt.n_filler) <= 1
    # the same seed gives the same prompt
    again = build_task_prompt(task, encode, length=length, depth=depth, rng=np.random.default_rng([7, int(depth * 100)]),
                              settings=SETTINGS)
    assert again.ids == prompt.ids


def test_spread_needles_follow_the_asked_one_and_distractors_move():
    prompt = build_task_prompt("multi-value", char_encode, length=2000, depth=0.5, rng=np.random.default_rng(0),
                               settings=SETTINGS)
    starts = prompt.needle_positions
    assert starts == sorted(starts) and starts[0] > len(INSTRUCTION) + 0.45 * prompt.n_filler
    keys = set()
    for seed in range(5):
        prompt = build_task_prompt("multi-key", char_encode, length=2000, depth=1.0,
                                   rng=np.random.default_rng(seed), settings=SETTINGS)
        assert prompt.needle_positions[0] == max(prompt.needle_positions)  # the asked one at the end
        keys.add(tuple(prompt.needle_positions[1:]))
    assert len(keys) == 5  # distractors at seeded random depths


def test_corpus_filler_is_used_and_tiled():
    filler = list(range(300, 340))
    prompt = build_task_prompt("single-key", char_encode, length=600, depth=0.5, rng=np.random.default_rng(1),
                               filler_ids=filler)
    used = [t for t in prompt.ids if t >= 300]
    assert len(used) == prompt.n_filler and used == (filler * 20)[:len(used)]


@pytest.mark.parametrize("task, right, wrong", [
    ("single-key", [" 40713"], [" 40714", " 4071", " 40713 40713", " abcde"]),
    ("multi-key", [" 40713", " 40713."], [" 12345", ""]),
    ("multi-value", [" 11111, 22222, 33333", " 33333, 11111, 22222", " 22222 33333 11111"],
     [" 11111, 22222", " 11111, 22222, 33333, 44444", " 11111, 22222, 22222"]),
    ("variable-tracking", [" ABCDE FGHIJ", " FGHIJ, ABCDE"], [" ABCDE", " ABCDE FGHIJ KLMNO", " ABCDE FGHIK"]),
])
def test_scorer_accepts_right_and_refuses_wrong_answers(task, right, wrong):
    expected = {"single-key": ["40713"], "multi-key": ["40713"], "multi-value": ["11111", "22222", "33333"],
                "variable-tracking": ["ABCDE", "FGHIJ"]}[task]
    ordered = task in ("single-key", "multi-key")
    for text in right:
        assert matches_answer(text, expected, ordered=ordered), text
    for text in wrong:
        assert not matches_answer(text, expected, ordered=ordered), text
    # through score_task: the first len(answer) tokens of a generation, decoded
    answer = " " + (", ".join(expected) if task == "multi-value" else " ".join(expected))
    prompt = SimpleNamespace(answer_ids=char_encode(answer), expected=expected, ordered=ordered)
    assert score_task(prompt, char_encode(answer) + char_encode(" and more"), char_decode)
    assert not score_task(prompt, char_encode(wrong[0].ljust(len(answer), " ")), char_decode)


def test_item_recall_gives_partial_credit_for_the_items_named():
    expected = ["11111", "22222", "33333", "44444"]
    assert item_recall(" 22222. One of the special magic numbers for", expected) == 0.25
    assert item_recall(" 44444, 11111, 33333, 22222", expected) == 1.0  # any order
    assert item_recall(" 22222, 22222, 22222", expected) == 0.25  # an item counts once per expected copy
    assert item_recall(" 2222 12345 abc", expected) == 0.0
    assert item_recall(" ABCDE FGHIJ", ["ABCDE", "KLMNO"]) == 0.5
    with pytest.raises(ValueError, match="no items"):
        item_recall(" 12345", [])
    # through judge_task: the first len(answer) tokens of a generation, decoded once for both scores
    prompt = SimpleNamespace(answer_ids=char_encode(" 11111, 22222"), expected=["11111", "22222"], ordered=False)
    assert judge_task(prompt, char_encode(" 22222, 99999 and 11111"), char_decode)[1] == 0.5


class OracleStub(ContextReader):
    """Answers every task from its context (char tokens kept in the KV cache); shift=1 moves every
    digit and capital letter by one, so every answer is wrong."""

    def __init__(self, shift=0):
        super().__init__()
        self.shift = shift

    def answer(self, text):
        if "are all the special magic numbers" in text:
            key = re.findall(r"What are all the special magic numbers for (\S+)\?", text)[-1]
            return ", ".join(v for k, v in MV.findall(text) if k == key), "numbers for " + key + " are"
        if "Which variables are assigned" in text:
            value = re.findall(r"assigned the value (\d+)\?", text)[-1]
            assignments = dict(VAR.findall(text))
            return " ".join(n for n in assignments if resolve(assignments, n) == value), f"assigned {value} are"
        key = re.findall(r"What is the special magic number for (\S+)\?", text)[-1]
        return dict(KV.findall(text))[key], "number for " + key + " is"

    def reply(self, context):
        answer, cue = self.answer(context)
        return "".join(chr((ord(c) - 48 + self.shift) % 10 + 48) if c.isdigit()
                       else chr((ord(c) - 65 + self.shift) % 26 + 65) if c.isupper() else c
                       for c in " " + answer + "."), cue


@pytest.mark.parametrize("task", TASKS)
def test_grid_scores_an_oracle_right_and_a_shifted_one_wrong(task):
    settings = TaskSettings(distractors=2, values=3, hops=2, chains=2)
    grid = task_grid(OracleStub(), task, char_encode, char_decode, lengths=[700, 900], depths=[0.0, 0.5, 1.0],
                     trials=2, settings=settings, progress=False)
    assert grid["accuracy"] == [[1.0] * 3] * 2 and grid["correct"] == [[2] * 3] * 2
    assert grid["lengths"] == [700, 900] and grid["depths"] == [0.0, 0.5, 1.0] and grid["trials"] == 2
    assert grid["task"] == task and grid["filler"] == "standard" and grid["settings"] == settings.of(task)
    assert grid["examples"] and grid["examples"][0]["items"] and sorted(grid["examples"][0]["items"]) == \
        sorted(grid["examples"][0]["expected"])
    assert grid["recall"] == [[1.0] * 3] * 2
    wrong = task_grid(OracleStub(shift=1), task, char_encode, char_decode, lengths=[700], depths=[0.5],
                      trials=2, settings=settings, progress=False)
    assert wrong["accuracy"] == [[0.0]] and wrong["recall"] == [[0.0]]


class FirstItemOracle(OracleStub):
    """Names only the first of the expected items, then goes on with other text: never exact, and
    for a task of n items a recall of 1 / n."""

    def reply(self, context):
        answer, cue = self.answer(context)
        return " " + answer.replace(",", " ").split()[0] + " and so on and so on.", cue


@pytest.mark.parametrize("task, items", [("multi-value", 4), ("variable-tracking", 2), ("single-key", 1)])
def test_grid_recall_credits_an_answer_that_names_some_items(task, items):
    grid = task_grid(FirstItemOracle(), task, char_encode, char_decode, lengths=[900], depths=[0.0, 1.0],
                     trials=3, settings=TaskSettings(values=4, hops=2), progress=False)
    assert grid["recall"] == [[1 / items] * 2]
    assert grid["correct"] == [[0, 0]] if items > 1 else grid["correct"] == [[3, 3]]
    # the report shows recall for the tasks of several items, beyond the window too
    table = grid_table("hybrid", grid, window=300)
    shown = f"| item recall, all depths | {1 / items:.0%} |"
    if items > 1:
        assert shown in table and f"| item recall, beyond the 300-token window | {1 / items:.0%} |" in table
    else:
        assert "item recall" not in table
    assert "item recall" not in grid_table("hybrid", {k: v for k, v in grid.items() if k != "recall"})


class HalfOracle(OracleStub):
    """Right when the asked needle's first value is even, wrong (shifted) otherwise, so that a grid's
    counts tell prompts apart; records the batch size of every prefill."""

    def __init__(self):
        super().__init__()
        self.batches = []

    def reply(self, context):
        answer, cue = self.answer(context)
        self.shift = int(answer.split(",")[0].split()[0][-1], 36) % 2
        return super().reply(context)

    def forward(self, ids, start_pos=0, kv_cache=None, logits_to_keep=0):
        if start_pos == 0:
            self.batches.append(ids.shape[0])
        return super().forward(ids, start_pos, kv_cache, logits_to_keep)


@pytest.mark.parametrize("task", ["single-key", "multi-value"])
def test_grid_batches_every_depth_of_a_length_without_changing_the_results(task):
    """A length's prompts are decoded together, depths mixed in a batch; the counts, the examples and
    the prompts (from each cell's own generator) are the same for every batch size."""
    settings = TaskSettings(values=3)
    grids, batches = {}, {}
    for batch_tokens in (None, 700, 5 * 700, 10 ** 6):
        model = HalfOracle()
        grids[batch_tokens] = task_grid(model, task, char_encode, char_decode, lengths=[700, 900],
                                        depths=[0.0, 0.5, 1.0], trials=4, settings=settings,
                                        batch_tokens=batch_tokens, progress=False)
        batches[batch_tokens] = model.batches
    assert batches[None] == [12, 12] and batches[10 ** 6] == [12, 12]  # every depth of a length at once
    assert batches[700] == [1] * 24  # 700 tokens: one prompt a batch
    assert batches[5 * 700] == [5, 5, 2, 3, 3, 3, 3]  # 5 then 3 prompts a batch, across the cells of 4
    first = grids[None]
    assert 0 < sum(map(sum, first["correct"])) < 24  # some right, some wrong
    for grid in grids.values():
        assert grid["correct"] == first["correct"] and grid["examples"] == first["examples"]
    assert [(e["length"], e["depth"]) for e in first["examples"]] == [(700, 0.0), (700, 1.0), (900, 0.0),
                                                                       (900, 1.0)]
    timings = first["timings"]  # where a grid's time went
    assert set(timings) == {"prompts", "prefill", "decode"} and min(timings.values()) > 0
    assert sum(timings.values()) <= first["seconds"] + 0.01 and first["batch_tokens"] is None
    with pytest.raises(ValueError, match="batch_tokens must be a positive int"):
        task_grid(HalfOracle(), task, char_encode, char_decode, lengths=[700], depths=[0.5], trials=1,
                  batch_tokens=0, progress=False)


@pytest.mark.parametrize("depth", [0.0, 0.5, 0.75, 0.9, 1.0])
def test_beyond_window_is_the_needles_distance_to_the_question(depth):
    """(1 - depth) * length, the distance `beyond_window` compares with the window, is the real
    distance from the asked needle's first token to the end of the prompt within the prompt's
    fixed parts (instruction, needle, question: a few dozen word tokens)."""
    encode = WordTokenizer().encode
    for length in (2048, 16384):
        prompt = build_task_prompt("single-key", encode, length=length, depth=depth,
                                   rng=np.random.default_rng(3), settings=SETTINGS)
        distance = length - prompt.needle_positions[0]
        fixed = length - prompt.n_filler
        assert 0 <= distance - (1.0 - depth) * prompt.n_filler <= fixed
        assert abs(distance - (1.0 - depth) * length) <= fixed < 64
        for window in (64, 256):
            if abs((1.0 - depth) * length - window) > fixed:  # far from the edge: the same verdict
                assert beyond_window(length, depth, window) == (distance > window)
    assert beyond_window(2048, 0.75, 256) and not beyond_window(2048, 0.9, 256)
    assert not beyond_window(2048, 1.0, 0) and beyond_window(16384, 0.95, 256)


def test_trials_and_intervals():
    assert trials_for_half_width() == 385  # 1.96^2 * 0.25 / 0.05^2 = 384.1, rounded up
    assert default_trials(5) == 77 and default_trials(1) == 385
    low, high = wilson_interval(0, 10)
    assert low == 0.0 and high == pytest.approx(0.2775, abs=1e-4)
    low, high = wilson_interval(5, 10)
    assert (low, high) == (pytest.approx(0.2366, abs=1e-4), pytest.approx(0.7634, abs=1e-4))
    low, high = wilson_interval(193, 385)  # about +-5 points at p = 0.5 with 385 trials
    assert high - low == pytest.approx(0.0996, abs=2e-3)


def test_task_names_settings_and_short_lengths():
    assert parse_tasks("all") == TASKS and parse_tasks("multi-key, single-key") == ("multi-key", "single-key")
    with pytest.raises(ValueError, match="unknown retrieval task.*'needle'"):
        parse_tasks("single-key,needle")
    with pytest.raises(ValueError, match="values must be an int >= 2"):
        TaskSettings(values=1)
    needed = minimum_length("multi-value", char_encode)
    with pytest.raises(ValueError, match=f"--task-lengths 100 too short for multi-value.*at least {needed}"):
        check_task_lengths(["multi-value"], char_encode, [100, 4000])
    check_task_lengths(TASKS, char_encode, [needed + 100, 4000], TaskSettings(values=3))
    # the default lengths (no --task-lengths given): the message names the default, not the flag
    with pytest.raises(ValueError, match=r"^the default task lengths \(1x, 2x, 4x and 8x the training length 50\) "
                                         rf"include 50,100, too short for multi-value.*pass --task-lengths of at least {needed}"):
        check_task_lengths(["multi-value"], char_encode, [50, 100, 4000], train_len=50)
