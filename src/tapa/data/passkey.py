"""Passkey-retrieval prompts (after Mohtashami & Jaggi, "Landmark Attention", 2023).

A prompt is, in tokens:

    instruction | filler[:before] | key sentence | filler[:after] | question

with key sentence " The pass key is NNNNN. Remember it. NNNNN is the pass key." and question
" What is the pass key? The pass key is"; the answer is " NNNNN". The filler is either the
repeated standard sentences or held-out corpus tokens. `depth` is the fraction of the filler that
comes before the key, so the key's first token sits at len(instruction) + round(depth * n_filler).

Each piece is encoded on its own and the ids are concatenated. Prompts therefore have exactly the
requested length, and the answer is always tokenized the same way in training samples and in the
evaluation, whatever the tokenizer does across piece boundaries.

`build_needle_prompt` is the general form (any instruction, any number of needles at their own
depths, any question); the retrieval tasks of `tapa.eval.tasks` build their prompts with it.

This module lives in `tapa.data` (not `tapa.eval`) so the trainer can mix passkey samples into
training batches without importing the evaluation package.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

INSTRUCTION = ("There is an important info hidden inside a lot of irrelevant text. "
               "Find it and memorize it. I will quiz you about the important information there.")
STANDARD_FILLER = " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
KEY_SENTENCE = " The pass key is {key}. Remember it. {key} is the pass key."
QUESTION = " What is the pass key? The pass key is"
ANSWER = " {key}"
KEY_DIGITS = 5

Encode = Callable[[str], Sequence[int]]


@dataclass
class PasskeyPrompt:
    """A prompt of exactly `len(ids)` tokens; `answer_ids` is what a correct model continues with."""

    ids: list[int]
    answer_ids: list[int]
    passkey: str
    key_position: int  # index in ids of the first token of the key sentence
    depth: float

    @property
    def expected(self) -> list[str]:
        """What the answer must hold (the evaluation's scorer reads it): the passkey's digits."""
        return [self.passkey]


def random_passkey(rng: np.random.Generator, digits: int = KEY_DIGITS) -> str:
    """A passkey of `digits` decimal digits, first digit non-zero."""
    return str(int(rng.integers(10 ** (digits - 1), 10 ** digits)))


def _filler_tokens(encode: Encode, count: int, filler_ids) -> list[int]:
    """`count` filler ids: the given ids (tiled if too short) or the repeated standard sentences."""
    if count <= 0:
        return []
    if filler_ids is None:
        source = list(encode(STANDARD_FILLER))
    else:
        source = [int(t) for t in np.asarray(filler_ids).reshape(-1)]
    if not source:
        raise ValueError("filler_ids must be non-empty (or None for the standard filler sentences)")
    repeats = -(-count // len(source))
    return (source * repeats)[:count]


def _check_depth(depth) -> None:
    if isinstance(depth, bool) or not isinstance(depth, (int, float)) or not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth must be in [0, 1], got {depth!r}")


def build_needle_prompt(encode: Encode, *, length: int, instruction: str,
                        needles: Sequence[tuple[float, str]], question: str, filler_ids=None,
                        what: str = "prompt") -> tuple[list[int], list[int], int]:
    """Token ids of exactly `length` tokens: instruction | filler with the needles in it | question.

    needles: (depth, text) pairs. Needle j goes after the first round(depth_j * n_filler) filler
    tokens, where n_filler = length - (instruction + needles + question tokens); needles at the same
    filler offset keep their given order. Every piece is encoded on its own (see the module note).
    Returns (ids, start of each needle in ids in the given order, n_filler). ValueError when the
    fixed pieces do not fit in `length`.
    """
    for depth, _ in needles:
        _check_depth(depth)
    head = list(encode(instruction))
    pieces = [list(encode(text)) for _, text in needles]
    tail = list(encode(question))
    fixed = len(head) + sum(map(len, pieces)) + len(tail)
    if isinstance(length, bool) or not isinstance(length, int) or length < fixed:
        raise ValueError(f"length must be an int of at least {fixed} tokens (the {what}'s instruction, "
                         f"needles and question with this tokenizer), got {length!r}")
    n_filler = length - fixed
    filler = _filler_tokens(encode, n_filler, filler_ids)
    offsets = [int(round(depth * n_filler)) for depth, _ in needles]
    order = sorted(range(len(needles)), key=lambda j: (offsets[j], j))
    ids, starts, cursor = list(head), [0] * len(needles), 0
    for j in order:
        ids += filler[cursor:offsets[j]]
        cursor = offsets[j]
        starts[j] = len(ids)
        ids += pieces[j]
    ids += filler[cursor:] + tail
    return ids, starts, n_filler


def build_passkey_prompt(encode: Encode, *, length: int, depth: float, passkey: str,
                         filler_ids=None) -> PasskeyPrompt:
    """Build a passkey prompt of exactly `length` tokens with the key at relative `depth` in [0, 1].

    encode: text -> token ids (e.g. `Corpus.encode`). filler_ids: held-out corpus token ids to use
    as filler (taken from their start, tiled when short); None uses the standard filler sentences.
    """
    if not isinstance(passkey, str) or not passkey.isdigit():
        raise ValueError(f"passkey must be a string of digits, got {passkey!r}")
    _check_depth(depth)
    ids, [key_position], _ = build_needle_prompt(
        encode, length=length, instruction=INSTRUCTION,
        needles=[(float(depth), KEY_SENTENCE.format(key=passkey))],
        question=QUESTION, filler_ids=filler_ids, what="passkey prompt")
    return PasskeyPrompt(ids=ids, answer_ids=list(encode(ANSWER.format(key=passkey))), passkey=passkey,
                         key_position=key_position, depth=float(depth))


def passkey_training_sample(encode: Encode, *, length: int, rng: np.random.Generator,
                            filler_ids=None) -> np.ndarray:
    """`length + 1` token ids: a passkey prompt (random key and depth) followed by its answer.

    Sized like a training sequence of `length` inputs plus the shifted target, so the trainer can
    put it in a batch in place of a corpus slice. filler_ids: corpus token ids (a random window of
    them is used as filler); None uses the standard filler sentences.
    """
    passkey = random_passkey(rng)
    answer = list(encode(ANSWER.format(key=passkey)))
    prompt_length = length + 1 - len(answer)
    if filler_ids is not None:
        filler_ids = np.asarray(filler_ids).reshape(-1)
        if filler_ids.size > prompt_length:
            start = int(rng.integers(0, filler_ids.size - prompt_length + 1))
            filler_ids = filler_ids[start:start + prompt_length]
    prompt = build_passkey_prompt(encode, length=prompt_length, depth=float(rng.uniform(0.0, 1.0)),
                                  passkey=passkey, filler_ids=filler_ids)
    return np.asarray(prompt.ids + answer, dtype=np.int64)


__all__ = ["PasskeyPrompt", "build_needle_prompt", "build_passkey_prompt", "passkey_training_sample",
           "random_passkey",
           "INSTRUCTION", "STANDARD_FILLER", "KEY_SENTENCE", "QUESTION", "ANSWER"]
