"""`tapa convert` to hybrids (issue 38): --layer-pattern, --local-window, --pe; Llama, Mistral, Qwen2
(q/k/v biases), Qwen3 (QK-norm)."""

from __future__ import annotations

import json
import math

import pytest
import torch

transformers = pytest.importorskip("transformers")
from transformers import (AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, MistralConfig,  # noqa: E402
                          MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM)

from helpers import rel_rmse  # noqa: E402

from tapa.cli import main as tapa_main  # noqa: E402
from tapa.hf.convert import convert_llama, low_frequency_first  # noqa: E402
from tapa.ops import split_dims  # noqa: E402

SIZES = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, initializer_range=0.2, tie_word_embeddings=False, eos_token_id=2,
             bos_token_id=1)
FAMILIES = {"llama": (LlamaConfig, LlamaForCausalLM), "mistral": (MistralConfig, MistralForCausalLM),
            "qwen2": (Qwen2Config, Qwen2ForCausalLM), "qwen3": (Qwen3Config, Qwen3ForCausalLM)}


def save_tiny(family: str, path, **extra):
    """A tiny random model of the family. Its attention biases and QK-norm weights (zeros and ones
    at transformers' init) are drawn too, so that a conversion that drops or misplaces them shows."""
    torch.manual_seed(0)
    config_class, model_class = FAMILIES[family]
    if family == "qwen3":  # transformers' Qwen3Config defaults to head_dim 128
        extra = {"head_dim": SIZES["hidden_size"] // SIZES["num_attention_heads"], **extra}
    model = model_class(config_class(**SIZES, **extra)).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "self_attn" in name and name.endswith(("_proj.bias", "_norm.weight")):
                param.copy_(0.5 * torch.randn_like(param) + name.endswith("_norm.weight"))
    model.save_pretrained(path)
    return model


def logits(model, ids):
    with torch.no_grad():
        return model(ids, use_cache=False).logits.double()


WIDE = {"head_dim": 32}  # 4 heads x 32 at hidden 64, as Qwen3-0.6B has 16 x 128 at 1024
FAMILY_CASES = [("llama", {}), ("mistral", {}), ("qwen2", {}), ("qwen3", {}), ("qwen3", WIDE), ("llama", WIDE)]


@pytest.mark.parametrize("family, extra", FAMILY_CASES, ids=["-".join([f, *map(str, e.values())]) for f, e in FAMILY_CASES])
def test_local_layers_are_the_original_model_inside_the_window(family, extra, tmp_path):
    """All-local conversion, window >= the sequence: the original model's logits (RoPE unchanged),
    Qwen2's biases, Qwen3's QK-norm and heads wider than hidden_size / heads included."""
    source = save_tiny(family, tmp_path / "src", **extra)
    ids = torch.randint(3, 97, (2, 12), generator=torch.Generator().manual_seed(1))
    out = convert_llama(tmp_path / "src", tmp_path / "out", layer_pattern="L", local_window=12)
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    assert model.config.layer_pattern == "L" and model.config.local_window == 12
    assert (model.config.attention_bias, model.config.qk_norm) == (family == "qwen2", family == "qwen3")
    assert model.config.head_dim == extra.get("head_dim", SIZES["hidden_size"] // SIZES["num_attention_heads"])
    torch.testing.assert_close(logits(model, ids), logits(source, ids), rtol=1e-4, atol=1e-4)
    # past the window they differ: the check can fail
    longer = torch.randint(3, 97, (1, 30), generator=torch.Generator().manual_seed(2))
    assert not torch.allclose(logits(model, longer), logits(source, longer), atol=1e-3)


def test_hybrid_with_rope_globals_is_the_original_inside_the_window(tmp_path):
    source = save_tiny("llama", tmp_path / "src")
    assert tapa_main(["convert", str(tmp_path / "src"), str(tmp_path / "out"), "--layer-pattern", "LLLG",
                      "--local-window", "16", "--pe", "rope"]) == 0
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    ids = torch.randint(3, 97, (1, 16), generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(logits(model, ids), logits(source, ids), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("pe", ["tapa", "nope"])
def test_hybrid_keeps_local_weights_exactly_and_splits_globals(pe, tmp_path):
    source = save_tiny("llama", tmp_path / "src")
    assert tapa_main(["convert", str(tmp_path / "src"), str(tmp_path / "out"), "--layer-pattern", "LLLG",
                      "--local-window", "8", "--pe", pe]) == 0
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    cfg = model.model.config
    assert (cfg.pe, cfg.layer_pattern, cfg.local_window) == (pe, "LLLG", 8)
    marker = json.loads((tmp_path / "out" / "tapa_convert.json").read_text())
    assert marker["layer_pattern"] == "LLLG" and marker["pe"] == pe and marker["model_type"] == "llama"
    for i, (ours, theirs) in enumerate(zip(model.model.layers, source.model.layers)):
        q, k = ours.attn.projection_weight("q"), ours.attn.projection_weight("k")
        same = torch.equal(q, theirs.self_attn.q_proj.weight) and torch.equal(k, theirs.self_attn.k_proj.weight)
        if i < 3 or pe == "nope":  # local layers, and NoPE globals: the checkpoint's weights as they are
            assert same, i
            assert ours.attn.wq_phase is None
        else:  # TAPA global: reordered, rescaled, split into amplitude and phase rows
            assert not same and ours.attn.wq_phase is not None
        assert torch.equal(ours.attn.wv.weight, theirs.self_attn.v_proj.weight)
    ids = torch.randint(3, 97, (1, 5), generator=torch.Generator().manual_seed(4))
    generated = model.generate(ids, max_new_tokens=20, do_sample=False)  # past the window, with a cache
    assert generated.shape == (1, 25)
    assert torch.equal(generated, model.generate(ids, max_new_tokens=20, do_sample=False, use_cache=False))


@torch.no_grad()
def without_rotary(source, ids: torch.Tensor, dims: torch.Tensor):
    """Hand-built reference: the source's layers (q/k/v biases and QK-norm as its own modules
    compute them), but attention is causal softmax on the given head dims of q and k, scaled by
    1/sqrt(head_dim), with no rotary embedding."""
    config = source.config  # Qwen2's has no head_dim
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    x = source.model.embed_tokens(ids)
    batch, length, _ = x.shape
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    for layer in source.model.layers:
        attn, h = layer.self_attn, layer.input_layernorm(x)
        q = attn.q_proj(h).view(batch, length, heads, head_dim)
        k = attn.k_proj(h).view(batch, length, kv_heads, head_dim)
        v = attn.v_proj(h).view(batch, length, kv_heads, head_dim).repeat_interleave(heads // kv_heads, dim=2)
        if hasattr(attn, "q_norm"):
            q, k = attn.q_norm(q), attn.k_norm(k)
        q, k = q[..., dims], k[..., dims].repeat_interleave(heads // kv_heads, dim=2)
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(head_dim)
        probs = scores.masked_fill(~causal, float("-inf")).softmax(-1)
        x = x + attn.o_proj(torch.einsum("bhqk,bkhd->bqhd", probs, v).reshape(batch, length, -1))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    return source.lm_head(source.model.norm(x))


@pytest.mark.parametrize("family, extra", [("qwen2", {}), ("qwen3", {}), ("qwen3", WIDE)], ids=["qwen2", "qwen3",
                                                                                                 "qwen3-wide"])
@pytest.mark.parametrize("theta", [0.5, 0.25])
def test_tapa_globals_with_phase_off_are_the_source_without_rotary(family, extra, theta, tmp_path):
    """Qwen2's biases are reordered and rescaled with their rows; under Qwen3's QK-norm the scales
    move to the norm weights. With the phase off, a TAPA global layer is the source's attention
    without rotary on the amplitude dims, which only holds when both are done right."""
    save_tiny(family, tmp_path / "src", **extra)
    out = convert_llama(tmp_path / "src", tmp_path / "out", theta=theta, phase_init_scale=0.0)
    model = AutoModelForCausalLM.from_pretrained(out).double().eval()
    source = FAMILIES[family][1].from_pretrained(tmp_path / "src").double().eval()
    head_dim = model.config.head_dim
    amp_dims = low_frequency_first(head_dim)[:split_dims(head_dim, theta)[0]]
    ids = torch.randint(3, 97, (2, 19), generator=torch.Generator().manual_seed(6))
    expected = without_rotary(source, ids, amp_dims)
    actual = logits(model, ids)
    assert rel_rmse(actual, expected) < 1e-6  # float32 weights rescaled by sqrt(d_A / D)
    marker = json.loads((out / "tapa_convert.json").read_text())
    assert marker["scales_on"] == ("q_norm/k_norm weights" if family == "qwen3" else "q/k rows and their biases")
    # the check can fail: the amplitude dims in the source's own order give other logits
    assert rel_rmse(without_rotary(source, ids, torch.arange(len(amp_dims))), expected) > 1e-2


def test_refusals_are_one_line_naming_what_is_supported(tmp_path):
    save_tiny("qwen3", tmp_path / "qwen3")
    config = json.loads((tmp_path / "qwen3" / "config.json").read_text())
    (tmp_path / "qwen3" / "config.json").write_text(json.dumps({**config, "model_type": "gemma"}))
    with pytest.raises(SystemExit, match=r"^tapa convert: error: model_type 'gemma' cannot be converted.*"
                                         r"supported: Llama, Mistral, Qwen2 and Qwen3[^\n]*$"):
        tapa_main(["convert", str(tmp_path / "qwen3"), str(tmp_path / "out")])
    llama = save_tiny("llama", tmp_path / "llama", attention_bias=True)  # q/k/v kept, o_proj's not
    with pytest.raises(SystemExit, match=r"o_proj.bias is not zero: TAPA's decoder has no bias there"):
        tapa_main(["convert", str(tmp_path / "llama"), str(tmp_path / "out")])
    with torch.no_grad():
        for layer in llama.model.layers:
            layer.self_attn.o_proj.bias.zero_()
    llama.save_pretrained(tmp_path / "llama")
    assert tapa_main(["convert", str(tmp_path / "llama"), str(tmp_path / "out"), "--layer-pattern", "L",
                      "--local-window", "12"]) == 0  # all-zero o_proj biases are dropped
    ids = torch.randint(3, 97, (1, 12), generator=torch.Generator().manual_seed(5))
    converted = AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    assert converted.config.attention_bias
    torch.testing.assert_close(logits(converted, ids), logits(llama, ids), rtol=1e-4, atol=1e-4)
    save_tiny("qwen2", tmp_path / "qwen2")
    with pytest.raises(SystemExit, match=r"layer_pattern"):
        tapa_main(["convert", str(tmp_path / "qwen2"), str(tmp_path / "out"), "--layer-pattern", "LXG"])


REAL_SHAPES = {  # the released models' widths, heads, vocabulary and RoPE base; 2 of their layers
    "qwen2.5-0.5b": ("qwen2", dict(hidden_size=896, num_attention_heads=14, num_key_value_heads=2,
                                   intermediate_size=4864)),
    "qwen3-0.6b": ("qwen3", dict(hidden_size=1024, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                                 intermediate_size=3072)),
}


@pytest.mark.slow
@pytest.mark.parametrize("shape", sorted(REAL_SHAPES))
def test_qwen_shaped_checkpoints_convert(shape, tmp_path):
    """Random models of Qwen2.5-0.5B's and Qwen3-0.6B's shapes (tied 151,936-token embeddings,
    head_dim 64 at 14 heads and 128 at 16 heads over width 1024), biases and norm weights drawn:
    an all-local conversion gives the source's logits."""
    family, sizes = REAL_SHAPES[shape]
    config_class, model_class = FAMILIES[family]
    torch.manual_seed(0)
    source = model_class(config_class(vocab_size=151936, num_hidden_layers=2, tie_word_embeddings=True,
                                      rope_theta=1e6, max_position_embeddings=32768, **sizes)).eval()
    with torch.no_grad():
        for name, param in source.named_parameters():
            if "self_attn" in name and name.endswith(("_proj.bias", "_norm.weight")):
                param.copy_(0.5 * torch.randn_like(param) + name.endswith("_norm.weight"))
    source.save_pretrained(tmp_path / "src")
    model = AutoModelForCausalLM.from_pretrained(
        convert_llama(tmp_path / "src", tmp_path / "out", layer_pattern="L", local_window=64)).eval()
    assert model.config.head_dim == sizes.get("head_dim", sizes["hidden_size"] // sizes["num_attention_heads"])
    assert (model.config.attention_bias, model.config.qk_norm) == (family == "qwen2", family == "qwen3")
    ids = torch.randint(0, 151936, (1, 64), generator=torch.Generator().manual_seed(1))
    assert rel_rmse(logits(model, ids), logits(source, ids)) < 1e-5
