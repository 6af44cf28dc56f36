"""Sliding-window perplexity versus evaluation length (the protocol of Press et al., ALiBi, 2022,
used by the TAPA and YaRN papers).

A token stream t_0..t_T gives T targets: target j is t_{j+1}, predicted from the inputs before it.
A window of W inputs starting at b predicts targets b..b+W-1. Windows start at 0, stride,
2*stride, ...; the last one is moved back to end exactly at the last target, so every window is
full. The first window scores all its W targets; each later window scores only the targets no
earlier window scored (the last `stride` ones, fewer at the end). Every target is scored exactly
once, each with between W - stride and W - 1 tokens of context except the first window's.

    perplexity = exp( sum_j -log p(t_{j+1} | window context) / T )

The loss by position bucket is a diagnostic beside it: the mean loss at each window position
range, over every position of every window (not only the scored ones). It shows where inside a long
window a model breaks.
"""

from __future__ import annotations

import math
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from tapa.eval.scaling import rope_scaling_at


def sliding_windows(n_targets: int, window: int, stride: int) -> list[tuple[int, int]]:
    """[(begin, first_scored_offset)] for windows of `window` targets over `n_targets` targets."""
    if not isinstance(window, int) or window < 1:
        raise ValueError(f"window must be a positive int, got {window!r}")
    if not isinstance(stride, int) or not 1 <= stride <= window:
        raise ValueError(f"stride must be an int in [1, window={window}], got {stride!r}")
    if n_targets < window:
        raise ValueError(f"need at least window + 1 = {window + 1} tokens for a window of {window}, "
                         f"got {n_targets + 1}")
    plan = [(0, 0)]
    scored_end = window
    while scored_end < n_targets:
        begin = min(plan[-1][0] + stride, n_targets - window)
        plan.append((begin, scored_end - begin))
        scored_end = begin + window
    return plan


def default_bucket_edges(window: int, first: int = 64) -> list[int]:
    """Doubling position buckets [0, 64), [64, 128), ... up to the window (fewer for short windows)."""
    edges = [0]
    edge = min(first, window)
    while edge < window:
        edges.append(edge)
        edge *= 2
    edges.append(window)
    return edges


@dataclass
class PerplexityResult:
    length: int
    stride: int
    loss: float  # mean negative log-likelihood (nats per token)
    perplexity: float
    tokens: int  # targets scored
    windows: int
    rope_scale: float
    seconds: float
    buckets: list[dict] = field(default_factory=list)  # {start, end, loss, perplexity}

    def to_dict(self) -> dict:
        return asdict(self)


def model_device(model) -> torch.device:
    try:
        return next(model.parameters()).device
    except (StopIteration, AttributeError):
        return torch.device("cpu")


def autocast_for(device: torch.device):
    """bfloat16 autocast on CUDA (how the models train there); plain float32 elsewhere."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return nullcontext()


def _token_nll(logits: torch.Tensor, targets: torch.Tensor, chunk: int = 4096) -> torch.Tensor:
    """Per-token cross-entropy in float32, (B, N); the float32 copy of the logits is made per chunk."""
    batch, length, vocab = logits.shape
    pieces = []
    for start in range(0, length, chunk):
        part = logits[:, start:start + chunk].float().reshape(-1, vocab)
        nll = F.cross_entropy(part, targets[:, start:start + chunk].reshape(-1), reduction="none")
        pieces.append(nll.view(batch, -1))
    return torch.cat(pieces, dim=1)


@torch.no_grad()
def sliding_window_perplexity(model, tokens, *, window: int, stride: int = 256,
                              max_tokens: int | None = None, bucket_edges: list[int] | None = None,
                              tokens_per_batch: int = 16384, progress: bool = True,
                              rope_scale: float = 1.0, desc: str | None = None,
                              pad_batches: bool | None = None) -> PerplexityResult:
    """Sliding-window perplexity of `model` on a 1-D token array at window length `window`.

    max_tokens caps the evaluation to the first max(max_tokens, window) + 1 tokens (a deterministic
    prefix). A stride larger than the window is capped at the window (non-overlapping windows).
    Windows are batched up to `tokens_per_batch` tokens per forward pass; with pad_batches (default:
    on CUDA) a short last batch repeats its last window, scored once, so that every batch of one
    length has one shape (a compiled attention then compiles once per length). The caller
    applies any eval-time positional scaling (see `perplexity_vs_length`); `rope_scale` is only
    recorded.
    """
    tokens = np.asarray(tokens).reshape(-1)
    stride = min(stride, window)
    if max_tokens is not None:
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be positive, got {max_tokens}")
        tokens = tokens[: max(max_tokens, window) + 1]
    plan = sliding_windows(len(tokens) - 1, window, stride)
    edges = bucket_edges or default_bucket_edges(window)
    if edges[0] != 0 or edges[-1] != window or any(a >= b for a, b in zip(edges, edges[1:])):
        raise ValueError(f"bucket_edges must increase from 0 to the window ({window}), got {edges}")
    device = model_device(model)
    position_loss = torch.zeros(window, dtype=torch.float64)
    nll_sum, scored, processed = 0.0, 0, 0
    per_batch = max(1, tokens_per_batch // window)
    pad = (device.type == "cuda") if pad_batches is None else pad_batches
    tqdm = tqdm_class()
    bar = tqdm(total=len(plan), desc=desc or f"perplexity @ {window}", unit="window",
               disable=None if progress else True, leave=False)  # None: quiet off a terminal
    start_time = time.perf_counter()
    model.eval()
    for first in range(0, len(plan), per_batch):
        group = plan[first:first + per_batch]
        # windows are copied out one batch at a time: the split may be a large uint16 memmap
        windows = [tokens[begin:begin + window + 1] for begin, _ in group]
        if pad and len(plan) > per_batch:
            windows += [windows[-1]] * (per_batch - len(group))
        rows = torch.from_numpy(np.stack(windows).astype(np.int64)).to(device)
        with autocast_for(device):
            logits = model(rows[:, :-1])
        nll = _token_nll(logits, rows[:, 1:]).double().cpu()[:len(group)]
        position_loss += nll.sum(dim=0)
        for row, (_, offset) in zip(nll, group):
            nll_sum += float(row[offset:].sum())
            scored += window - offset
        processed += len(group) * window
        bar.update(len(group))
        bar.set_postfix(tok_s=f"{processed / max(time.perf_counter() - start_time, 1e-9):.0f}")
    bar.close()
    seconds = time.perf_counter() - start_time
    position_loss /= len(plan)
    buckets = [{"start": a, "end": b, "loss": float(position_loss[a:b].mean()),
                "perplexity": math.exp(float(position_loss[a:b].mean()))} for a, b in zip(edges, edges[1:])]
    loss = nll_sum / scored
    return PerplexityResult(length=window, stride=stride, loss=loss, perplexity=math.exp(loss),
                            tokens=scored, windows=len(plan), rope_scale=rope_scale, seconds=seconds,
                            buckets=buckets)


def perplexity_vs_length(model, tokens, *, lengths: list[int], train_len: int, stride: int = 256,
                         max_tokens: int | None = None, tokens_per_batch: int = 16384,
                         progress: bool = True, label: str | None = None) -> list[PerplexityResult]:
    """Sliding-window perplexity at each length, with the model's RoPE scaling set for that length
    (rope-pi, rope-ntk, rope-yarn get factor length / train_len; the others run unchanged)."""
    if not lengths:
        raise ValueError("lengths must be a non-empty list of evaluation lengths")
    results = []
    for length in lengths:
        with rope_scaling_at(model, length, train_len) as factor:
            name = f"{label or model.config.pe} ppl @ {length}"
            results.append(sliding_window_perplexity(
                model, tokens, window=length, stride=stride, max_tokens=max_tokens,
                tokens_per_batch=tokens_per_batch, progress=progress, rope_scale=factor, desc=name))
        if progress:  # a line a length: the bar leaves none, and draws nothing off a terminal
            done = results[-1]
            print(f"{name}: {done.perplexity:.2f} ({done.windows} windows, {done.seconds:.1f} s)",
                  file=sys.stderr, flush=True)
    return results


def tqdm_class():
    from tapa._optional import require

    return require("tqdm").tqdm
