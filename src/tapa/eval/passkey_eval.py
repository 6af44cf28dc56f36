"""Passkey retrieval: a grid of context lengths x key depths, several seeded trials per cell.

The prompts come from `tapa.data.passkey.build_passkey_prompt`. The model decodes greedily through
its KV cache; a trial is correct when the decoded answer, stripped of surrounding whitespace, is
exactly the passkey's digits.
"""

from __future__ import annotations

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
        for start in range(0, prompt_ids.shape[1], chunk):
            logits = model(prompt_ids[:, start:start + chunk], start_pos=start, kv_cache=cache)
        generated = [logits[:, -1].argmax(dim=-1)]
        for _ in range(max_new_tokens - 1):
            logits = model(generated[-1][:, None], start_pos=cache.length, kv_cache=cache)
            generated.append(logits[:, -1].argmax(dim=-1))
    return torch.stack(generated, dim=1).cpu()


def _trial_filler(filler_ids, length: int, trial_rng: np.random.Generator):
    """A deterministic window of the held-out tokens for one trial (None: standard sentences)."""
    if filler_ids is None:
        return None
    filler_ids = np.asarray(filler_ids).reshape(-1)
    if filler_ids.size <= length:
        return filler_ids
    start = int(trial_rng.integers(0, filler_ids.size - length))
    return filler_ids[start:start + length]


def is_correct(generated_ids, answer_ids, passkey: str, decode=None) -> bool:
    """Exact match of the greedy answer: its decoded text, stripped, equals the passkey (with no
    decode, the token ids must equal the answer's)."""
    generated_ids = [int(t) for t in generated_ids[:len(answer_ids)]]
    if decode is None:
        return generated_ids == list(answer_ids)
    return decode(generated_ids).strip() == passkey


def passkey_grid(model, encode, decode=None, *, lengths: list[int], depths=DEFAULT_DEPTHS,
                 trials: int = 5, seed: int = 0, filler_ids=None, train_len: int | None = None,
                 prefill_chunk: int | None = None, progress: bool = True, label: str | None = None) -> dict:
    """Passkey accuracy for every (length, depth) cell, `trials` seeded prompts each.

    filler_ids: held-out corpus tokens for the filler (a different seeded window per trial);
    None uses the standard filler sentences. RoPE-family scaling is applied per length as in the
    perplexity evaluation (needs train_len).
    Returns a dict: lengths, depths, trials, accuracy[length][depth], rope_scale per length,
    examples (a few decoded answers) and seconds.
    """
    if not lengths or not depths:
        raise ValueError("lengths and depths must be non-empty")
    if trials < 1:
        raise ValueError(f"trials must be >= 1, got {trials}")
    start_time = time.perf_counter()
    accuracy, scales, examples = [], [], []
    tqdm = tqdm_class()
    bar = tqdm(total=len(lengths) * len(depths), desc=f"{label or model.config.pe} passkey",
               unit="cell", disable=not progress, leave=False)
    model.eval()
    for li, length in enumerate(lengths):
        with rope_scaling_at(model, length, train_len or length) as factor:
            row = []
            for di, depth in enumerate(depths):
                rng = np.random.default_rng([seed, li, di])
                prompts = []
                for _ in range(trials):
                    passkey = random_passkey(rng)
                    prompts.append(build_passkey_prompt(encode, length=length, depth=float(depth),
                                                        passkey=passkey,
                                                        filler_ids=_trial_filler(filler_ids, length, rng)))
                answer_len = max(len(p.answer_ids) for p in prompts)
                ids = torch.tensor([p.ids for p in prompts], dtype=torch.long)
                generated = greedy_generate(model, ids, answer_len, prefill_chunk=prefill_chunk)
                hits = [is_correct(g.tolist(), p.answer_ids, p.passkey, decode)
                        for g, p in zip(generated, prompts)]
                row.append(sum(hits) / trials)
                if decode is not None and len(examples) < 2 * len(lengths) and di in (0, len(depths) - 1):
                    examples.append({"length": length, "depth": float(depth), "passkey": prompts[0].passkey,
                                     "output": decode(generated[0, :len(prompts[0].answer_ids)].tolist())})
                bar.update(1)
            accuracy.append(row)
            scales.append(factor)
    bar.close()
    return {"lengths": list(lengths), "depths": [float(d) for d in depths], "trials": trials,
            "seed": seed, "filler": "standard" if filler_ids is None else "corpus",
            "accuracy": accuracy, "rope_scale": scales, "examples": examples,
            "seconds": time.perf_counter() - start_time}
