"""Training batches: packed contiguous windows of a flat token array, a pure function of
(seed, step), so a resumed or re-sharded run sees exactly the same data.

Each epoch cuts the token array into n = (len - seq_len) // seq_len windows of seq_len + 1 tokens
(consecutive windows share one token: the last target of one is the first input of the next),
starting at a random offset in [0, seq_len), and visits them in a random order; both are drawn from
numpy's generator seeded with (seed, epoch). Global sample g of the run is window
g mod n of epoch g // n; step s uses samples s*batch_size ... (s+1)*batch_size - 1,
and rank r of W takes the r-th contiguous slice of batch_size / W of them.

Optional passkey mixing replaces a sample with a passkey-retrieval sequence
(tapa.data.passkey.passkey_training_sample, filler taken from the replaced window) with
probability passkey_fraction, drawn from a generator seeded with (seed, global sample index).
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

# distinct streams: (seed, _EPOCH_STREAM, epoch) for window order, (seed, _PASSKEY_STREAM, g) for
# passkey mixing, so changing one never shifts the other
_EPOCH_STREAM = 0
_PASSKEY_STREAM = 1


class WindowSampler:
    """Deterministic windows of `seq_len + 1` tokens from `tokens` (a 1-D array or memmap)."""

    def __init__(self, tokens, seq_len: int, seed: int, *, split: str = "train"):
        tokens = np.asarray(tokens) if not isinstance(tokens, np.ndarray) else tokens
        if tokens.ndim != 1:
            raise ValueError(f"tokens must be 1-D, got shape {tokens.shape}")
        if not isinstance(seq_len, int) or seq_len <= 0:
            raise ValueError(f"seq_len must be a positive int, got {seq_len!r}")
        # the epoch offset can eat up to seq_len - 1 tokens; keep at least one full window
        if tokens.size < 2 * seq_len:
            raise ValueError(f"the {split} split has {tokens.size} tokens, too few for seq_len="
                             f"{seq_len} (need at least {2 * seq_len}); use a larger corpus "
                             f"(max_train_bytes) or a shorter seq_len")
        self.tokens = tokens
        self.seq_len = seq_len
        self.seed = seed
        # every offset in [0, seq_len) leaves at least this many whole windows
        self.windows_per_epoch = (tokens.size - seq_len) // seq_len
        self._epoch_cache: tuple[int, int, np.ndarray] | None = None

    def _epoch(self, epoch: int) -> tuple[int, np.ndarray]:
        """(offset, window order) of an epoch."""
        if self._epoch_cache is None or self._epoch_cache[0] != epoch:
            rng = np.random.default_rng([self.seed, _EPOCH_STREAM, epoch])
            offset = int(rng.integers(0, self.seq_len))
            self._epoch_cache = (epoch, offset, rng.permutation(self.windows_per_epoch))
        return self._epoch_cache[1], self._epoch_cache[2]

    def window(self, sample: int) -> np.ndarray:
        """The `sample`-th window of the run (int64, seq_len + 1 tokens)."""
        epoch, position = divmod(sample, self.windows_per_epoch)
        offset, order = self._epoch(epoch)
        start = offset + int(order[position]) * self.seq_len
        return np.asarray(self.tokens[start:start + self.seq_len + 1], dtype=np.int64)


class BatchLoader:
    """Per-rank batches of the global batch of `step`: array (batch_size // world_size, seq_len + 1)."""

    def __init__(self, tokens, *, seq_len: int, batch_size: int, seed: int, rank: int = 0,
                 world_size: int = 1, passkey_fraction: float = 0.0,
                 encode: Callable[[str], Sequence[int]] | None = None):
        if batch_size % world_size:
            raise ValueError(f"batch_size ({batch_size}) must be divisible by the number of "
                             f"processes ({world_size})")
        if passkey_fraction > 0 and encode is None:
            raise ValueError("passkey_fraction > 0 needs the corpus' encode function")
        self.sampler = WindowSampler(tokens, seq_len, seed)
        self.seq_len = seq_len
        self.batch_size = batch_size
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.local_batch_size = batch_size // world_size
        self.passkey_fraction = passkey_fraction
        self.encode = encode

    def sample(self, index: int) -> np.ndarray:
        """Global sample `index` of the run: a corpus window, or a passkey sequence in its place."""
        window = self.sampler.window(index)
        if self.passkey_fraction > 0:
            rng = np.random.default_rng([self.seed, _PASSKEY_STREAM, index])
            if rng.random() < self.passkey_fraction:
                from tapa.data.passkey import passkey_training_sample

                window = passkey_training_sample(self.encode, length=self.seq_len, rng=rng,
                                                 filler_ids=window)
                if window.shape != (self.seq_len + 1,):
                    raise RuntimeError(f"passkey_training_sample returned shape {window.shape}, "
                                       f"expected ({self.seq_len + 1},)")
        return window

    def batch(self, step: int) -> np.ndarray:
        first = step * self.batch_size + self.rank * self.local_batch_size
        return np.stack([self.sample(first + i) for i in range(self.local_batch_size)])


def validation_windows(tokens, seq_len: int, count: int) -> np.ndarray:
    """`count` fixed windows of seq_len + 1 tokens spread evenly over the val split."""
    tokens = np.asarray(tokens) if not isinstance(tokens, np.ndarray) else tokens
    if tokens.size < seq_len + 1:
        raise ValueError(f"the val split has {tokens.size} tokens, fewer than seq_len + 1 = "
                         f"{seq_len + 1}; use a shorter seq_len or a larger val_fraction")
    last_start = tokens.size - seq_len - 1
    starts = np.linspace(0, last_start, num=count).astype(np.int64)
    return np.stack([np.asarray(tokens[s:s + seq_len + 1], dtype=np.int64) for s in starts])
