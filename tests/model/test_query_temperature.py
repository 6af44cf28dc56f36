"""The global layers' query temperature (Llama 4's form): off changes nothing, positions below the
base change nothing, later ones are scaled; the cache and the static decoding step agree with the
full forward."""

import math

import pytest
import torch

from tapa.model import ModelConfig, TapaLM

VOCAB = 67


def _model(pe, pattern, base, scale=0.5):
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=VOCAB, dim=32, n_layers=4, n_heads=2, pe=pe, layer_pattern=pattern,
                      local_window=6, init_std=0.3, query_temperature_base=base,
                      query_temperature_scale=scale)
    return TapaLM(cfg).double().eval()


def _ids(length=24, seed=1):
    return torch.randint(0, VOCAB, (2, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("pe, pattern", [("tapa", "LLLG"), ("nope", "LLLG"), ("rope", "G")])
def test_positions_below_the_base_are_unchanged_and_later_ones_move(pe, pattern):
    ids = _ids()
    with torch.no_grad():
        plain = _model(pe, pattern, 0)(ids)
        tempered = _model(pe, pattern, 8)(ids)
    # positions 0..6 have floor((p + 1) / 8) = 0: factor 1, and causal: nothing later leaks in
    assert torch.equal(plain[:, :7], tempered[:, :7])
    assert float((plain[:, 8:] - tempered[:, 8:]).abs().max()) > 1e-6


def test_the_factor_scales_tapa_amplitude_only():
    model = _model("tapa", "G", 4, scale=0.1)
    attn = model.layers[0].attn
    q = torch.randn(1, 9, 2, attn.cfg.head_dim, dtype=torch.float64)
    positions = torch.arange(9)[None]
    out = attn.temper(q, positions)
    factor = torch.tensor([1 + 0.1 * math.log1p((p + 1) // 4) for p in range(9)], dtype=torch.float64)
    assert torch.allclose(out[..., :attn.amp_dim], q[..., :attn.amp_dim] * factor[None, :, None, None])
    assert torch.equal(out[..., attn.amp_dim:], q[..., attn.amp_dim:])
    with pytest.raises(ValueError, match="query_temperature_base"):
        _model("tapa", "G", -1)


@pytest.mark.parametrize("pe, pattern", [("tapa", "LLLG"), ("nope", "LLLG")])
def test_cache_and_static_decoding_agree_with_the_full_forward(pe, pattern):
    model = _model(pe, pattern, 4)
    ids = _ids(20)
    with torch.no_grad():
        full = model(ids)
        cache = model.new_kv_cache(2, 20)
        steps = [model(ids[:, :8], 0, cache)] + [model(ids[:, t:t + 1], t, cache) for t in range(8, 20)]
    assert torch.allclose(torch.cat(steps, dim=1), full, atol=1e-10, rtol=0)
    prompt = ids[:, :10]
    generated = model.generate(prompt, max_new_tokens=6)  # the static decoding step
    sequence = prompt
    with torch.no_grad():
        for _ in range(6):
            sequence = torch.cat([sequence, model(sequence)[:, -1:].argmax(-1)], dim=1)
    assert torch.equal(generated, sequence[:, 10:])


@pytest.mark.parametrize("pe, pattern", [("tapa", "LLLG"), ("nope", "LLLG")])
def test_the_eval_time_temperature_is_the_trained_one_on_the_same_weights(pe, pattern):
    """tapa eval --eval-query-temperature: a copy of a model trained without the temperature that
    computes what a model built with it computes, weights for weights; the model itself unchanged."""
    from tapa.eval.scaling import with_query_temperature

    plain, built = _model(pe, pattern, 0, scale=0.3), _model(pe, pattern, 8, scale=0.3)
    built.load_state_dict(plain.state_dict())
    variant = with_query_temperature(plain, 8, 0.3)
    ids = _ids()
    with torch.no_grad():
        assert torch.equal(variant(ids), built(ids))
        assert not torch.equal(variant(ids), plain(ids))
    assert plain.config.query_temperature_base == 0 and next(variant.parameters()).dtype == torch.float64
    for base in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="base must be an int >= 1"):
            with_query_temperature(plain, base)
    local = TapaLM(ModelConfig(vocab_size=VOCAB, dim=32, n_layers=2, n_heads=2, pe="nope", layer_pattern="L",
                               local_window=6))
    with pytest.raises(ValueError, match="acts on global layers; this model has none"):
        with_query_temperature(local, 8)
