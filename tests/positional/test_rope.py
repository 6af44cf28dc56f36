"""RoPE-family frequencies: closed forms, and agreement with transformers' modeling_rope_utils."""

import math

import pytest
import torch

from tapa.positional.rope import apply_rope, rope_cos_sin, rope_frequencies, rope_inv_freq

HEAD_DIM, BASE, ORIGINAL = 64, 10000.0, 512


def test_rope_inv_freq_closed_form():
    inv_freq = rope_inv_freq(8, 100.0)
    assert torch.allclose(inv_freq, torch.tensor([1.0, 100 ** -0.25, 100 ** -0.5, 100 ** -0.75]))


def test_pi_divides_positions():
    rope, _ = rope_frequencies("rope", HEAD_DIM)
    pi, _ = rope_frequencies("pi", HEAD_DIM, factor=4.0)
    cos_pi, _ = rope_cos_sin(pi, torch.arange(0, 400, 4))
    cos_rope, _ = rope_cos_sin(rope, torch.arange(100))
    torch.testing.assert_close(cos_pi, cos_rope, atol=1e-4, rtol=0)


def test_dynamic_ntk_is_plain_rope_within_original_length():
    plain, _ = rope_frequencies("rope", HEAD_DIM)
    dyn, _ = rope_frequencies("dynamic-ntk", HEAD_DIM, factor=2.0, original_seq_len=ORIGINAL, seq_len=ORIGINAL)
    longer, _ = rope_frequencies("dynamic-ntk", HEAD_DIM, factor=2.0, original_seq_len=ORIGINAL,
                                 seq_len=4 * ORIGINAL)
    assert torch.equal(plain, dyn)
    assert longer[0] == plain[0] and (longer[1:] < plain[1:]).all()


def test_yarn_keeps_high_and_interpolates_low_frequencies():
    plain, _ = rope_frequencies("rope", HEAD_DIM)
    yarn, attention_factor = rope_frequencies("yarn", HEAD_DIM, factor=8.0, original_seq_len=ORIGINAL)
    assert torch.equal(yarn[:2], plain[:2])
    torch.testing.assert_close(yarn[-2:], plain[-2:] / 8.0)
    assert attention_factor == pytest.approx(0.1 * math.log(8.0) + 1.0)


def test_apply_rope_preserves_norm_and_relative_angle():
    torch.manual_seed(0)
    inv_freq, _ = rope_frequencies("rope", HEAD_DIM)
    q, k = torch.randn(1, 1, 1, HEAD_DIM), torch.randn(1, 1, 1, HEAD_DIM)

    def score(m, n):
        cos_m, sin_m = rope_cos_sin(inv_freq, torch.tensor([m]))
        cos_n, sin_n = rope_cos_sin(inv_freq, torch.tensor([n]))
        return (apply_rope(q, cos_m, sin_m) * apply_rope(k, cos_n, sin_n)).sum().item()

    cos, sin = rope_cos_sin(inv_freq, torch.tensor([37]))
    assert apply_rope(q, cos, sin).norm().item() == pytest.approx(q.norm().item(), rel=1e-5)
    assert score(10, 3) == pytest.approx(score(107, 100), rel=1e-4, abs=1e-4)


def test_bad_arguments():
    with pytest.raises(ValueError, match="method"):
        rope_frequencies("alibi", HEAD_DIM)
    with pytest.raises(ValueError, match="factor"):
        rope_frequencies("pi", HEAD_DIM, factor=0.0)
    with pytest.raises(ValueError, match="head_dim"):
        rope_inv_freq(7)


# --- the formulas users already trust -------------------------------------------------------

def _hf_frequencies(rope_type, factor, seq_len=None, **extra):
    transformers = pytest.importorskip("transformers")
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    params = {"rope_type": rope_type, "factor": factor, "rope_theta": BASE, **extra}
    common = dict(hidden_size=HEAD_DIM * 4, num_attention_heads=4, max_position_embeddings=ORIGINAL)
    major = int(transformers.__version__.split(".")[0])
    if major >= 5:
        config = LlamaConfig(rope_parameters=params, **common)
    else:
        params.pop("rope_theta")
        config = LlamaConfig(rope_scaling=params, rope_theta=BASE, **common)
    return ROPE_INIT_FUNCTIONS[rope_type](config, "cpu", seq_len=seq_len)


def test_pi_matches_transformers():
    hf_freq, hf_factor = _hf_frequencies("linear", 4.0)
    ours, factor = rope_frequencies("pi", HEAD_DIM, base=BASE, factor=4.0)
    torch.testing.assert_close(ours, hf_freq.float(), rtol=1e-6, atol=0)
    assert factor == pytest.approx(hf_factor)


@pytest.mark.parametrize("seq_len", [4 * ORIGINAL, 3 * ORIGINAL + 7])
def test_dynamic_ntk_matches_transformers(seq_len):
    hf_freq, _ = _hf_frequencies("dynamic", 2.0, seq_len=seq_len)
    ours, _ = rope_frequencies("dynamic-ntk", HEAD_DIM, base=BASE, factor=2.0,
                               original_seq_len=ORIGINAL, seq_len=seq_len)
    torch.testing.assert_close(ours, hf_freq.float(), rtol=1e-5, atol=0)


@pytest.mark.parametrize("factor", [4.0, 16.0])
def test_yarn_matches_transformers(factor):
    hf_freq, hf_factor = _hf_frequencies("yarn", factor, beta_fast=32.0, beta_slow=1.0,
                                         original_max_position_embeddings=ORIGINAL)
    ours, attention_factor = rope_frequencies("yarn", HEAD_DIM, base=BASE, factor=factor,
                                              original_seq_len=ORIGINAL)
    torch.testing.assert_close(ours, hf_freq.float(), rtol=1e-5, atol=0)
    assert attention_factor == pytest.approx(hf_factor)


def test_head_dim_two_rope_and_ntk():
    """head_dim 2 is valid for plain RoPE and PI (it used to raise ZeroDivisionError); the NTK
    rules, whose base scaling divides by head_dim - 2, say so."""
    inv_freq, factor = rope_frequencies("rope", 2)
    assert inv_freq.tolist() == [1.0] and factor == 1.0
    assert rope_frequencies("pi", 2, factor=4.0)[0].tolist() == [0.25]
    with pytest.raises(ValueError, match="needs head_dim > 2, got 2"):
        rope_frequencies("ntk", 2, factor=2.0)
