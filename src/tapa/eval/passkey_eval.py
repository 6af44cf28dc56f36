"""Passkey retrieval: a grid of context lengths x key depths, several seeded trials per cell.

The prompts come from `tapa.data.passkey.build_passkey_prompt`. The model decodes greedily through
its KV cache; a trial is correct when the decoded answer, stripped of surrounding whitespace, is
exactly the passkey's digits.

`needle_grid` is the grid runner itself (seeded prompts per cell, batched greedy decoding, a
scorer); the retrieval tasks of `tapa.eval.tasks` run on it too, and `matches_answer` is the
exact-match rule they share.
"""

from __future__ import annotations

import itertools
import re
import time
from collections import Counter

import numpy as np
import torch

from tapa.data.passkey import build_passkey_prompt, random_passkey
from tapa.eval.perplexity import autocast_for, model_device, tqdm_class
from tapa.eval.scaling import rope_scaling_at

DEFAULT_DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)


@torch.no_grad()
def greedy_generate(model, prompt_ids: torch.Tensor, max_new_tokens: int,
                    prefill_chunk: int | None = None, timings: dict | None = None) -> torch.Tensor:
    """Greedy continuation (B, max_new_tokens) of prompts (B, N) through the model's KV cache.

    prefill_chunk: feed the prompt in chunks of this many tokens (bounds activation memory on
    long prompts; the result is the same). timings: a dict to which the seconds of the prefill and
    of the decoding steps are added (keys "prefill" and "decode"; the device is synchronized at
    each end).
    """
    if prompt_ids.dim() != 2 or prompt_ids.shape[1] == 0:
        raise ValueError(f"prompt_ids must be (batch, seqlen) with seqlen > 0, got {tuple(prompt_ids.shape)}")
    device = model_device(model)
    clock = _Clock(device, timings)
    prompt_ids = prompt_ids.to(device)
    cache = model.new_kv_cache(prompt_ids.shape[0], prompt_ids.shape[1] + max_new_tokens)
    chunk = prefill_chunk or prompt_ids.shape[1]
    with autocast_for(device):
        for start in range(0, prompt_ids.shape[1], chunk):  # the last position's logits only
            logits = model(prompt_ids[:, start:start + chunk], start_pos=start, kv_cache=cache, logits_to_keep=1)
        generated = [logits[:, -1].argmax(dim=-1)]
        clock.lap("prefill")
        for _ in range(max_new_tokens - 1):
            logits = model(generated[-1][:, None], start_pos=cache.length, kv_cache=cache)
            generated.append(logits[:, -1].argmax(dim=-1))
    out = torch.stack(generated, dim=1).cpu()
    clock.lap("decode")
    return out


class _Clock:
    """Seconds between laps added to timings[name] (nothing without a dict), the device synchronized
    first so that a lap holds its kernels."""

    def __init__(self, device: torch.device, timings: dict | None):
        self.device, self.timings = device, timings
        self.last = time.perf_counter()

    def lap(self, name: str) -> None:
        if self.timings is None:
            return
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        now = time.perf_counter()
        self.timings[name] = self.timings.get(name, 0.0) + now - self.last
        self.last = now


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


def item_recall(text: str, expected) -> float:
    """The share of `expected` items found among the decoded answer's items (`answer_items`; each
    counted at most as often as it is expected), whatever else the answer holds: partial credit for
    an answer that names some of several values (RULER scores its multi-value and
    variable-tracking tasks so)."""
    expected = [str(item) for item in expected]
    if not expected:
        raise ValueError("expected holds no items")
    left = Counter(answer_items(text))
    found = 0
    for item in expected:
        if left[item] > 0:
            left[item] -= 1
            found += 1
    return found / len(expected)


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


# Prompts of one length share a batch whatever their depth, up to this many tokens a batch. Only the
# last position's logits are kept (no tokens x vocab tensor), so the budget is the KV cache and one
# layer's activations: at 256k tokens, about 2.4 GB of global-layer cache and 1.6 GB of bf16 MLP
# activations for the 124M hybrid (dim 768, 3 global layers). Fewer, larger batches mean fewer
# decoding steps, which are launch-bound on a GPU.
RETRIEVAL_BATCH_TOKENS = 262144


def needle_grid(model, make_prompt, score, *, lengths, depths, trials: int, seed, train_len: int | None = None,
                prefill_chunk: int | None = None, batch_tokens: int | None = RETRIEVAL_BATCH_TOKENS,
                progress: bool = True, desc: str = "retrieval", example=None) -> dict:
    """Accuracy of a needle-retrieval task on every (length, depth) cell, `trials` prompts each.

    make_prompt(rng, length, depth) -> a prompt with .ids (exactly `length` tokens) and .answer_ids;
    the model greedily decodes max(len(answer_ids)) tokens of a batch for each prompt, and
    score(prompt, generated_ids) says whether it is right: a bool, or (right, item recall) when the
    answer's items are also counted (`item_recall`), and the grid then holds the recall's mean per
    cell as `recall` too. The prompts of one length are decoded
    together, every depth's, in batches of at most batch_tokens // length prompts (all of them when
    None). The cell's generator is seeded with [*seed, length index, depth index], so each cell's
    prompts are the same whatever else the grid holds or however they are batched.
    example(prompt, generated_ids) -> a dict kept for the first and last depth of each length.
    RoPE-family scaling is set per length as in the perplexity evaluation (train_len).
    Returns {lengths, depths, trials, accuracy[length][depth], correct[length][depth], rope_scale
    per length, examples, batch_tokens, seconds, and the seconds spent building prompts, in prefills
    and in decoding steps (`timings`)}.
    """
    if not lengths or not depths:
        raise ValueError("lengths and depths must be non-empty")
    if isinstance(trials, bool) or not isinstance(trials, int) or trials < 1:
        raise ValueError(f"trials must be an int >= 1, got {trials!r}")
    if batch_tokens is not None and (isinstance(batch_tokens, bool) or not isinstance(batch_tokens, int)
                                     or batch_tokens < 1):
        raise ValueError(f"batch_tokens must be a positive int or None, got {batch_tokens!r}")
    seed = list(seed) if isinstance(seed, (list, tuple)) else [seed]
    start_time = time.perf_counter()
    timings = {"prompts": 0.0, "prefill": 0.0, "decode": 0.0}
    accuracy, correct, scales, examples, recalls = [], [], [], [], []
    with_recall = False  # whether `score` counts the answer's items too
    bar = progress_bar(progress, total=len(lengths) * len(depths) * trials, desc=desc, unit="prompt")
    model.eval()
    for li, length in enumerate(lengths):
        count = len(depths) * trials
        per_batch = count if batch_tokens is None else max(1, min(count, batch_tokens // length))
        prompts = _length_prompts(make_prompt, seed, li, length, depths, trials)
        hits, found = [0] * len(depths), [0.0] * len(depths)
        with rope_scaling_at(model, length, train_len or length) as factor:
            for _ in range(0, count, per_batch):
                built = time.perf_counter()
                group = list(itertools.islice(prompts, per_batch))
                timings["prompts"] += time.perf_counter() - built
                answer_len = max(len(prompt.answer_ids) for _, _, prompt in group)
                ids = torch.tensor([prompt.ids for _, _, prompt in group], dtype=torch.long)
                generated = greedy_generate(model, ids, answer_len, prefill_chunk=prefill_chunk, timings=timings)
                for (di, trial, prompt), output in zip(group, generated.tolist()):
                    judged = score(prompt, output)
                    right, share = judged if isinstance(judged, tuple) else (judged, None)
                    hits[di] += bool(right)
                    if share is not None:
                        found[di] += share
                        with_recall = True
                    if example is not None and trial == 0 and di in (0, len(depths) - 1):
                        examples.append({"length": length, "depth": float(depths[di]), **example(prompt, output)})
                bar.update(len(group))
        accuracy.append([h / trials for h in hits])
        correct.append(hits)
        recalls.append([round(f / trials, 4) for f in found])
        scales.append(factor)
    bar.close()
    return {"lengths": list(lengths), "depths": [float(d) for d in depths], "trials": trials,
            "accuracy": accuracy, "correct": correct, "rope_scale": scales, "examples": examples,
            **({"recall": recalls} if with_recall else {}),
            "batch_tokens": batch_tokens, "seconds": time.perf_counter() - start_time,
            "timings": {name: round(value, 3) for name, value in timings.items()}}


def _length_prompts(make_prompt, seed: list, length_index: int, length: int, depths, trials: int):
    """(depth index, trial, prompt) of every cell of one length, depth by depth, each cell's prompts
    from its own generator seeded with [*seed, length index, depth index]."""
    for di, depth in enumerate(depths):
        rng = np.random.default_rng([*seed, length_index, di])
        for trial in range(trials):
            yield di, trial, make_prompt(rng, length, float(depth))


def passkey_grid(model, encode, decode=None, *, lengths: list[int], depths=DEFAULT_DEPTHS,
                 trials: int = 5, seed: int = 0, filler_ids=None, train_len: int | None = None,
                 prefill_chunk: int | None = None, batch_tokens: int | None = RETRIEVAL_BATCH_TOKENS,
                 progress: bool = True, label: str | None = None) -> dict:
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
