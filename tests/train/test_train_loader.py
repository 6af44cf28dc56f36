"""The batch loader: windows of the token array, deterministic by (seed, step), sharded by rank."""

import numpy as np
import pytest

from tapa.data.passkey import QUESTION
from tapa.train.loader import BatchLoader, WindowSampler, validation_windows

TOKENS = np.arange(10_007, dtype=np.uint32)  # token i is i: a window's content gives its start


def test_windows_are_contiguous_slices():
    loader = BatchLoader(TOKENS, seq_len=16, batch_size=8, seed=3)
    for step in range(5):
        batch = loader.batch(step)
        assert batch.shape == (8, 17) and batch.dtype == np.int64
        assert (np.diff(batch, axis=1) == 1).all()


def test_deterministic_and_seeded():
    a = BatchLoader(TOKENS, seq_len=16, batch_size=8, seed=3)
    b = BatchLoader(TOKENS, seq_len=16, batch_size=8, seed=3)
    c = BatchLoader(TOKENS, seq_len=16, batch_size=8, seed=4)
    assert np.array_equal(a.batch(7), b.batch(7))
    assert np.array_equal(a.batch(2), a.batch(2))  # no hidden state between calls
    assert not np.array_equal(a.batch(7), c.batch(7))
    assert not np.array_equal(a.batch(7), a.batch(8))


def test_ranks_split_the_global_batch():
    whole = BatchLoader(TOKENS, seq_len=16, batch_size=8, seed=1).batch(11)
    for world in (2, 4):
        parts = [BatchLoader(TOKENS, seq_len=16, batch_size=8, seed=1, rank=r, world_size=world).batch(11)
                 for r in range(world)]
        assert np.array_equal(np.concatenate(parts), whole)
    with pytest.raises(ValueError, match="batch_size \\(8\\) must be divisible"):
        BatchLoader(TOKENS, seq_len=16, batch_size=8, seed=1, world_size=3)


def test_an_epoch_visits_each_window_once():
    sampler = WindowSampler(TOKENS, 100, seed=0)
    n = sampler.windows_per_epoch
    for epoch in range(2):
        starts = [int(sampler.window(epoch * n + i)[0]) for i in range(n)]
        assert len(set(starts)) == n
        offsets = {s % 100 for s in starts}
        assert len(offsets) == 1  # one offset per epoch, windows 100 tokens apart
        assert max(starts) + 101 <= TOKENS.size


def test_passkey_mixing():
    vocab = {}

    def encode(text):  # a word-level toy tokenizer; ids stay within the toy vocabulary
        return [vocab.setdefault(word, len(vocab) + 20_000) for word in text.split(" ")]

    mixed = BatchLoader(TOKENS, seq_len=300, batch_size=200, seed=0, passkey_fraction=0.3,
                        encode=encode)
    batch = mixed.batch(0)
    question = encode(QUESTION)
    is_passkey = np.array([any(np.array_equal(row[i:i + len(question)], question)
                               for i in range(len(row) - len(question))) for row in batch])
    assert batch.shape == (200, 301)
    assert 0.2 < is_passkey.mean() < 0.4
    corpus_rows = batch[~is_passkey]
    assert (np.diff(corpus_rows, axis=1) == 1).all()  # the others are untouched windows
    again = BatchLoader(TOKENS, seq_len=300, batch_size=200, seed=0, passkey_fraction=0.3,
                        encode=encode).batch(0)
    assert np.array_equal(batch, again)
    with pytest.raises(ValueError, match="encode"):
        BatchLoader(TOKENS, seq_len=16, batch_size=8, seed=0, passkey_fraction=0.1)


def test_bad_inputs():
    with pytest.raises(ValueError, match="too few for seq_len=6000"):
        BatchLoader(TOKENS, seq_len=6000, batch_size=1, seed=0)
    with pytest.raises(ValueError, match="1-D"):
        WindowSampler(TOKENS.reshape(1, -1), 16, seed=0)
    with pytest.raises(ValueError, match="val split"):
        validation_windows(TOKENS[:10], 16, 2)
    val = validation_windows(TOKENS, 16, 5)
    assert val.shape == (5, 17) and val[0, 0] == 0 and val[-1, -1] == TOKENS.size - 1
