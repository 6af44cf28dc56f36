"""Loads this folder's jsonl files for lm-evaluation-harness (`custom_dataset: !function utils.NAME`),
so the tasks need neither network nor a datasets cache and run from any working directory.

python_choices.jsonl lists the correct continuation first (answer 0), which is easy to write and
check by eye. A scorer must not be able to profit from that, so `choice_rows` puts each row's
choices in a fixed pseudo-random order (a hash of the seed, the context and the choice: the same
on every machine and Python version) and moves `answer` with the correct one.
"""

import hashlib
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
SHUFFLE_SEED = 0


def read_rows(name):
    return [json.loads(line) for line in (HERE / name).read_text().splitlines() if line.strip()]


def choice_rows(seed=SHUFFLE_SEED):
    """The multiple-choice rows with shuffled choices; `answer` indexes the correct one."""
    rows = []
    for row in read_rows("python_choices.jsonl"):
        def rank(choice, context=row["context"]):
            return hashlib.sha256(f"{seed}\0{context}\0{choice}".encode()).hexdigest()

        choices = sorted(row["choices"], key=rank)
        rows.append({**row, "choices": choices, "answer": choices.index(row["choices"][row["answer"]])})
    return rows


def _split(rows):
    import datasets

    return {"test": datasets.Dataset.from_list(rows)}


def load_choices(**kwargs):
    return _split(choice_rows())


def load_snippets(**kwargs):
    return _split(read_rows("python_snippets.jsonl"))
