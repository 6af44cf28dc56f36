"""Passkey retrieval: a grid of context lengths x key depths, several seeded trials per cell.

The prompts come from `tapa.data.passkey.build_passkey_prompt`. The model decodes greedily through
its KV cache; a trial is correct when the decoded answer, stripped of surrounding whitespace, is
exactly the passkey's digits.

`needle_grid` is the grid runner itself (seeded prompts per cell, batched greedy decoding, a
scorer); the retrieval tasks of `tapa.eval.tasks` run on it too, and `matches_answer` is the
exact-match rule they share.
"""

from __future__ import annotations

import re
import time

import numpy as np
import torch

from tapa.data.passkey import build_passkey_prompt, random_passkey
from tapa.eval.perplexity import autocast_for, model_device, tqdm_class
from tapa.eval.scaling import rope_scaling_at

DEFAULT_DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)


@torch.no_grad()
def greedy_generate(model, prompt_ids: torch.Tensor, max_new_tokens: int,
                    prefill_chunk: int | None = None) -> torch.Tensor:
    """Greedy continuation (B, max_new_tokens) of prompts (B, N) through the model's KV cache.

    prefill_chunk: feed the prompt in chunks of this many tokens (bounds activation memory on
    long prompts; the result is the same).
    """
    if prompt_ids.dim() != 2 or prompt_ids.shape[1] == 0:
        raise ValueError(f"prompt_ids must be (batch, seqlen) with seqlen > 0, got {tuple(prompt_ids.shape)}")
    device = model_device(model)
    prompt_ids = prompt_ids.to(device)
    cache = model.new_kv_cache(prompt_ids.shape[0], prompt_ids.shape[1] + max_new_tokens)
    chunk = prefill_chunk or prompt_ids.shape[1]
    with autocast_for(device):
        for start in range(0, prompt_ids.shape[1], chunk):  # the last position's logits only
            logits = model(prompt_ids[:, start:start + chunk], start_pos=start, kv_cache=cache, logits_to_keep=1)
        generated = [logits[:, -1].argmax(dim=-1)]
        for _ in range(max_new_tokens - 1):
            logits = model(generated[-1][:, None], start_pos=cache.length, kv_cache=cache)
            generated.append(logits[:, -1].argmax(dim=-1))
    return torch.stack(generated, dim=1).cpu()


def trial_filler(filler_ids, length: int, trial_rng: np.random.Generator):
    """A seeded window of `length` corpus tokens for one trial (all of them, to be tiled, when there
    are fewer; None: the standard filler sentences)."""
    if filler_ids is None:
        return None
    filler_ids = np.asarray(filler_ids).reshape(-1)
    if filler_ids.size <= length:
        return filler_ids
    start = int(trial_rng.integers(0, filler_ids.size - length))
    return filler_ids[start:start + length]


_trial_filler = trial_filler  # the name earlier code imported


def answer_items(text: str) -> list[str]:
    """The items of a decoded answer: the words of the text between spaces, commas, periods and
    semicolons (' 12345, 67890.' -> ['12345', '67890'])."""
    return [item for item in re.split(r"[\s,.;]+", text) if item]


def matches_answer(text: str, expected, *, ordered: bool = True) -> bool:
    """Exact match: the decoded answer's items (`answer_items`) are exactly `expected`, in its order
    or, with ordered=False, in any order (each item as many times as expected; nothing extra)."""
    items = answer_items(text)
    expected = [str(item) for item in expected]
    return items == expected if ordered else sorted(items) == sorted(expected)


def is_correct(generated_ids, answer_ids, passkey: str, decode=None) -> bool:
    """Exact match of the greedy answer: its decoded text, stripped, equals the passkey (with no
    decode, the token ids must equal the answer's)."""
    generated_ids = [int(t) for t in generated_ids[:len(answer_ids)]]
    if decode is None:
        return generated_ids == list(answer_ids)
    return matches_answer(decode(generated_ids), [passkey])


def progress_bar(progress: bool, **kwargs):
    """A tqdm bar that stays quiet off a terminal (and always with progress=False); it is removed
    when done."""
    tqdm = tqdm_class()
    return tqdm(disable=None if progress else True, leave=False, **kwargs)


def needle_grid(model, make_prompt, score, *, lengths, depths, trials: int, seed, train_len: int | None = None,
                prefill_chunk: int | None = None, batch_tokens: int | None = None, progress: bool = True,
                desc: str = "retrieval", example=None) -> dict:
    """Accuracy of a needle-retrieval task on every (length, depth) cell, `trials` prompts each.

    make_prompt(rng, length, depth) -> a prompt with .ids (exactly `length` tokens) and .answer_ids;
    the model greedily decodes max(len(answer_ids)) tokens for each prompt (in batches of at most
    batch_tokens // length prompts, all of a cell's at once when None), and score(prompt,
    generated_ids) says whether it is right. The cell's generator is seeded with [*seed, length
    index, depth index], so each cell's prompts are the same whatever else the grid holds.
    example(prompt, generated_ids) -> a dict kept for the first and last depth of each length.
    RoPE-family scaling is set per length as in the perplexity evaluation (train_len).
    Returns {lengths, depths, trials, accuracy[length][depth], correct[length][depth], rope_scale
    per length, examples, seconds}.
    """
    if not lengths or not depths:
        raise ValueError("lengths and depths must be non-empty")
    if isinstance(trials, bool) or not isinstance(trials, int) or trials < 1:
        raise ValueError(f"trials must be an int >= 1, got {trials!r}")
    seed = list(seed) if isinstance(seed, (list, tuple)) else [seed]
    start_time = time.perf_counter()
    accuracy, correct, scales, examples = [], [], [], []
    bar = progress_bar(progress, total=len(lengths) * len(depths), desc=desc, unit="cell")
    model.eval()
    for li, length in enumerate(lengths):
        per_batch = trials if batch_tokens is None else max(1, min(trials, batch_tokens // length))
        with rope_scaling_at(model, length, train_len or length) as factor:
            row, hits_row = [], []
            for di, depth in enumerate(depths):
                rng = np.random.default_rng([*seed, li, di])
                prompts = [make_prompt(rng, length, float(depth)) for _ in range(trials)]
                hits = 0
                for first in range(0, trials, per_batch):
                    group = prompts[first:first + per_batch]
                    answer_len = max(len(p.answer_ids) for p in group)
                    ids = torch.tensor([p.ids for p in group], dtype=torch.long)
                    generated = greedy_generate(model, ids, answer_len, prefill_chunk=prefill_chunk)
                    for index, (prompt, output) in enumerate(zip(group, generated.tolist())):
                        hits += bool(score(prompt, output))
                        if example is not None and first + index == 0 and di in (0, len(depths) - 1):
                            examples.append({"length": length, "depth": float(depth), **example(prompt, output)})
                row.append(hits / trials)
                hits_row.append(hits)
                bar.update(1)
            accuracy.append(row)
            correct.append(hits_row)
            scales.append(factor)
    bar.close()
    return {"lengths": list(lengths), "depths": [float(d) for d in depths], "trials": trials,
            "accuracy": accuracy, "correct": correct, "rope_scale": scales, "examples": examples,
            "seconds": time.perf_counter() - start_time}


def passkey_grid(model, encode, decode=None, *, lengths: list[int], depths=DEFAULT_DEPTHS,
                 trials: int = 5, seed: int = 0, filler_ids=None, train_len: int | None = None,
                 prefill_chunk: int | None = None, batch_tokens: int | None = None, progress: bool = True,
                 label: str | None = None) -> dict:
    """Passkey accuracy for every (length, depth) cell, `trials` seeded prompts each (`needle_grid`).

    filler_ids: held-out corpus tokens for the filler (a different seeded window per trial);
    None uses the standard filler sentences. RoPE-family scaling is applied per length as in the
    perplexity evaluation (needs train_len).
    Returns a dict: lengths, depths, trials, accuracy[length][depth], correct[length][depth],
    rope_scale per length, examples (a few decoded answers) and seconds.
    """
    def make_prompt(rng, length, depth):
        passkey = random_passkey(rng)
        return build_passkey_prompt(encode, length=length, depth=depth, passkey=passkey,
                                    filler_ids=trial_filler(filler_ids, length, rng))

    def score(prompt, output):
        return is_correct(output, prompt.answer_ids, prompt.passkey, decode)

    def example(prompt, output):
        return {"passkey": prompt.passkey, "output": decode(output[:len(prompt.answer_ids)])}

    grid = needle_grid(model, make_prompt, score, lengths=lengths, depths=depths, trials=trials, seed=seed,
                       train_len=train_len, prefill_chunk=prefill_chunk, batch_tokens=batch_tokens,
                       progress=progress, desc=f"{label or model.config.pe} passkey",
                       example=example if decode is not None else None)
    return {**grid, "seed": seed, "filler": "standard" if filler_ids is None else "corpus"}
