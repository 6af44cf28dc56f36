"""Sliding-window perplexity: the window plan, a hand-computed value, eval-time RoPE scaling."""

import math

import numpy as np
import pytest
import torch
from torch import nn

from tapa.eval.perplexity import default_bucket_edges, sliding_window_perplexity, sliding_windows
from tapa.eval.scaling import rope_scaling_at, with_positional
from tapa.model import ModelConfig, TapaLM


class PositionStub(nn.Module):
    """logits[i] = table[token_i] + i * slope: depends on the position inside the window, so the
    perplexity depends on which window scores each token."""

    def __init__(self, vocab=11, seed=0):
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        self.table = nn.Parameter(torch.randn(vocab, vocab, generator=generator))
        self.slope = nn.Parameter(torch.randn(vocab, generator=generator))
        self.config = None

    def forward(self, ids):
        positions = torch.arange(ids.shape[1], dtype=torch.float32)[None, :, None]
        return self.table[ids] + positions * self.slope


@pytest.mark.parametrize("n_targets,window,stride", [
    (7, 4, 2), (8, 4, 4), (4, 4, 1), (100, 16, 5), (97, 32, 32), (33, 32, 7), (1000, 64, 63)])
def test_every_target_scored_exactly_once(n_targets, window, stride):
    counts = np.zeros(n_targets, dtype=int)
    plan = sliding_windows(n_targets, window, stride)
    assert plan[0] == (0, 0)
    for begin, offset in plan:
        assert 0 <= begin and begin + window <= n_targets  # every window is full
        counts[begin + offset:begin + window] += 1
        assert offset == 0 or window - offset <= stride  # later windows score only new tokens
    assert (counts == 1).all()


def test_window_plan_rejects_bad_arguments():
    with pytest.raises(ValueError, match="window"):
        sliding_windows(3, 4, 2)
    with pytest.raises(ValueError, match="stride"):
        sliding_windows(10, 4, 5)
    with pytest.raises(ValueError, match="stride"):
        sliding_windows(10, 4, 0)


def test_perplexity_equals_hand_computed_value():
    model = PositionStub()
    tokens = np.array([3, 1, 4, 1, 5, 9, 2, 6])  # 7 targets
    # window 4, stride 2: windows start at 0 (scores targets 0-3 at positions 0-3), at 2 (targets 4,
    # 5 at positions 2, 3), and at 3 (target 6 at position 3).
    window_position = {0: 0, 1: 1, 2: 2, 3: 3, 4: 2, 5: 3, 6: 3}
    nll = []
    for target, position in window_position.items():
        logits = model.table[tokens[target]] + position * model.slope
        nll.append(-torch.log_softmax(logits.double(), -1)[tokens[target + 1]].item())
    expected = math.exp(sum(nll) / len(nll))
    result = sliding_window_perplexity(model, tokens, window=4, stride=2, progress=False)
    assert result.tokens == 7 and result.windows == 3
    assert result.perplexity == pytest.approx(expected, rel=1e-5)
    # the same tokens scored without overlap (stride = window) differ: the protocol matters
    other = sliding_window_perplexity(model, tokens, window=4, stride=4, progress=False)
    assert other.perplexity != pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("pe", ["tapa", "rope"])
def test_perplexity_matches_explicit_windows_on_a_real_model(pe):
    torch.manual_seed(0)
    model = TapaLM(ModelConfig(vocab_size=64, dim=32, n_layers=2, n_heads=2, pe=pe)).eval()
    tokens = np.random.default_rng(1).integers(0, 64, 60)
    window, stride = 16, 5
    nll_sum, count = 0.0, 0
    with torch.no_grad():
        for begin, offset in sliding_windows(len(tokens) - 1, window, stride):
            ids = torch.tensor(tokens[begin:begin + window + 1])
            logp = torch.log_softmax(model(ids[None, :-1])[0].double(), -1)
            for i in range(offset, window):
                nll_sum -= logp[i, ids[i + 1]].item()
                count += 1
    shapes = []
    model.register_forward_pre_hook(lambda module, args: shapes.append(tuple(args[0].shape)))
    for pad in (False, True):
        shapes.clear()
        result = sliding_window_perplexity(model, tokens, window=window, stride=stride, progress=False,
                                           tokens_per_batch=48, pad_batches=pad)  # 3 windows a batch
        assert count == len(tokens) - 1 == result.tokens
        assert result.loss == pytest.approx(nll_sum / count, rel=1e-5)
        # 10 windows in batches of 3: padded, the last batch repeats a window (not scored again),
        # so a compiled attention sees one shape per length
        assert result.windows == 10 and shapes == [(3, window)] * 3 + [(3 if pad else 1, window)]
    assert [b["start"] for b in result.buckets] == [0] and result.buckets[-1]["end"] == window


def test_max_tokens_cap_and_buckets():
    model = PositionStub()
    tokens = np.random.default_rng(0).integers(0, 11, 5000)
    result = sliding_window_perplexity(model, tokens, window=256, stride=64, max_tokens=1000, progress=False)
    assert result.tokens == 1000
    assert [(b["start"], b["end"]) for b in result.buckets] == [(0, 64), (64, 128), (128, 256)]
    assert default_bucket_edges(1000) == [0, 64, 128, 256, 512, 1000]
    with pytest.raises(ValueError, match="bucket_edges"):
        sliding_window_perplexity(model, tokens, window=8, bucket_edges=[0, 4], progress=False)


def test_pi_factor_is_applied_at_eval_and_restored():
    torch.manual_seed(0)
    config = dict(vocab_size=64, dim=32, n_layers=1, n_heads=2, original_seq_len=16,
                  init_std=0.3)  # sharp attention, so the rotation matters
    rope = TapaLM(ModelConfig(pe="rope", **config)).eval()
    pi = with_positional(rope, "rope-pi", train_len=16)
    ids = torch.randint(0, 64, (1, 64))
    with torch.no_grad():
        plain = rope(ids)
        assert torch.equal(pi(ids), plain)  # factor 1: PI is plain RoPE
        with rope_scaling_at(pi, 64, train_len=16) as factor:
            scaled = pi(ids)
        assert factor == 4.0 and pi.config.rope_scale == 1.0
        # the expected logits: the same weights built with rope_scale = 4
        reference = TapaLM(ModelConfig(pe="rope-pi", rope_scale=4.0, **config)).eval()
        reference.load_state_dict(rope.state_dict())
        assert torch.allclose(scaled, reference(ids), atol=1e-6)
        assert not torch.allclose(scaled, plain, atol=1e-3)
        # the first token attends only to itself, where every rotation cancels: unchanged
        assert torch.allclose(scaled[:, 0], plain[:, 0], atol=1e-5)
        with rope_scaling_at(rope, 64, train_len=16) as factor:  # plain RoPE gets no scaling
            assert factor == 1.0 and torch.equal(rope(ids), plain)


def test_each_finished_length_is_one_line_unless_quiet(capsys):
    """Off a terminal the bars draw nothing, so every finished length says its perplexity on stderr
    (a log file sees progress); progress=False prints nothing."""
    from tapa.eval.perplexity import perplexity_vs_length

    model = TapaLM(ModelConfig(vocab_size=32, dim=16, n_layers=1, n_heads=2, pe="rope"))
    tokens = np.arange(200) % 32
    results = perplexity_vs_length(model, tokens, lengths=[16, 32], train_len=16, stride=16,
                                   label="RoPE")
    err = capsys.readouterr().err.splitlines()
    assert [line.split(":")[0] for line in err] == ["RoPE ppl @ 16", "RoPE ppl @ 32"]
    assert f"{results[1].perplexity:.2f} ({results[1].windows} windows" in err[1]
    perplexity_vs_length(model, tokens, lengths=[16], train_len=16, progress=False)
    assert capsys.readouterr().err == ""
