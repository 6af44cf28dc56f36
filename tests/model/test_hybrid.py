"""Hybrid models: local sliding-window RoPE layers next to global layers, and their KV cache."""

import pytest
import torch

from tapa.model import ModelConfig, TapaLM

VOCAB = 61


def config(**overrides):
    values = dict(vocab_size=VOCAB, dim=64, n_layers=4, n_heads=4, n_kv_heads=2, pe="tapa",
                  layer_pattern="LLLG", local_window=8, init_std=0.1)
    values.update(overrides)
    return ModelConfig(**values)


def test_layer_pattern_repeats_and_names_the_hybrid():
    cfg = config(n_layers=6, layer_pattern="LG")
    assert [cfg.layer_kind(i) for i in range(6)] == ["local", "global"] * 3
    assert cfg.label == "TAPA hybrid (LG, w8)"
    assert config(layer_pattern="G").label == "TAPA" and not config(layer_pattern="G").is_hybrid
    for bad in ("", "LXG", 3):
        with pytest.raises(ValueError, match="layer_pattern"):
            config(layer_pattern=bad)
    with pytest.raises(ValueError, match="local_window"):
        config(local_window=0)
    with pytest.raises(ValueError, match="never reaches its global layer"):
        config(n_layers=3)  # LLLG cut to LLL
    assert not any(config(n_layers=2, layer_pattern="L").layer_kind(i) == "global" for i in range(2))


def local_only_outputs(device="cpu", dtype=torch.float32, window=8, length=40, changed_at=None):
    """Logits of a one-layer, all-local model (window `window`) on fixed random ids."""
    torch.manual_seed(0)
    model = TapaLM(config(n_layers=1, layer_pattern="L", local_window=window)).to(device, dtype).eval()
    ids = torch.randint(0, VOCAB, (2, length), generator=torch.Generator().manual_seed(1))
    if changed_at is not None:
        ids[:, changed_at] = (ids[:, changed_at] + 1) % VOCAB
    with torch.no_grad():
        return model(ids.to(device)).float().cpu()


def check_locality(device, dtype, length=40):
    window, t = 8, length - 10
    base = local_only_outputs(device, dtype, window, length)
    outside = local_only_outputs(device, dtype, window, length, changed_at=t - window)
    inside = local_only_outputs(device, dtype, window, length, changed_at=t - window + 1)
    torch.testing.assert_close(outside[:, t], base[:, t], atol=0, rtol=0)
    assert (inside[:, t] - base[:, t]).abs().max() > 1e-4
    assert (outside[:, t - 1] - base[:, t - 1]).abs().max() > 1e-4  # t - 1 does see it


def test_local_layer_sees_exactly_its_window_on_cpu():
    check_locality("cpu", torch.float32)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_local_layer_sees_exactly_its_window_on_flex_attention(monkeypatch):
    import tapa.ops.local.window as local

    calls = []
    flex = local._flex
    monkeypatch.setattr(local, "_flex", lambda *args: calls.append(1) or flex(*args))
    check_locality("cuda", torch.float32, length=300)  # long enough for the FlexAttention path
    assert calls, "the local layer did not run on FlexAttention"


@pytest.mark.parametrize("pe", ["tapa", "nope", "rope-yarn"])
def test_cached_decoding_past_the_window_equals_full_forward(pe):
    """Prefill in chunks (one longer than the window), then one token at a time far past the
    window: the ring buffers of the local layers give the logits of the full forward."""
    torch.manual_seed(2)
    model = TapaLM(config(pe=pe, rope_scale=2.0, original_seq_len=16)).double().eval()
    ids = torch.randint(0, VOCAB, (2, 45))
    with torch.no_grad():
        full = model(ids)
        cache = model.new_kv_cache(2, 45)
        pieces = [model(ids[:, :3], 0, cache), model(ids[:, 3:14], 3, cache)]
        for pos in range(14, 45):
            pieces.append(model(ids[:, pos:pos + 1], pos, cache))
    torch.testing.assert_close(torch.cat(pieces, 1), full, rtol=1e-10, atol=1e-10)
    local, global_ = cache.keys[0], cache.keys[3]
    assert local.shape[1] == 8 and global_.shape[1] == 45  # local memory bounded by the window


def test_greedy_generation_past_the_window_with_and_without_cache():
    from tapa.eval.passkey_eval import greedy_generate

    torch.manual_seed(3)
    model = TapaLM(config(init_std=0.3)).eval()
    prompt = torch.randint(0, VOCAB, (1, 12))
    cached = greedy_generate(model, prompt, 20)
    ids = prompt
    with torch.no_grad():
        for _ in range(20):
            ids = torch.cat([ids, model(ids)[:, -1:].argmax(-1)], dim=1)
    assert torch.equal(cached, ids[:, 12:])
    assert len(set(cached.flatten().tolist())) > 3


def test_eval_time_scaling_leaves_local_layers_alone():
    """set_rope_scale changes the global RoPE layers only: an all-local model is unaffected."""
    torch.manual_seed(4)
    model = TapaLM(config(pe="rope-yarn", layer_pattern="L", n_layers=2, original_seq_len=8)).eval()
    ids = torch.randint(0, VOCAB, (1, 30))
    with torch.no_grad():
        before = model(ids)
        model.set_rope_scale(4.0)
        torch.testing.assert_close(model(ids), before, atol=0, rtol=0)
