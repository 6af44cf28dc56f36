"""The example lm-eval multiple-choice task: the correct answer is not always in one position, and
the shuffle keeps it correct."""

import json
from collections import Counter

from helpers import ROOT, load_file

TASKS = ROOT / "examples" / "lm_eval_task"


def task_utils():
    return load_file(TASKS / "utils.py", "lm_eval_task_utils")


def test_answers_are_shuffled_deterministically_and_stay_correct():
    utils = task_utils()
    raw = [json.loads(line) for line in (TASKS / "python_choices.jsonl").read_text().splitlines() if line]
    rows = utils.choice_rows()
    assert rows == utils.choice_rows()  # the same order on every call (and machine: a sha256)
    for before, after in zip(raw, rows):
        assert sorted(after["choices"]) == sorted(before["choices"])
        assert after["choices"][after["answer"]] == before["choices"][before["answer"]]
    positions = Counter(row["answer"] for row in rows)
    assert len(positions) == 3 and max(positions.values()) <= len(rows) // 2, positions
    assert [r["answer"] for r in utils.choice_rows(seed=1)] != [r["answer"] for r in rows]


def test_choices_task_reports_length_normalised_accuracy():
    text = (TASKS / "tapa_python_choices.yaml").read_text()
    assert "metric: acc_norm" in text and "metric: acc\n" in text
