"""`tapa convert` to hybrids (issue 38): --layer-pattern, --local-window, --pe; Llama, Mistral, Qwen2."""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")
from transformers import (AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, MistralConfig,  # noqa: E402
                          MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM)

from tapa.cli import main as tapa_main  # noqa: E402
from tapa.hf.convert import convert_llama  # noqa: E402

SIZES = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, initializer_range=0.2, tie_word_embeddings=False, eos_token_id=2,
             bos_token_id=1)
FAMILIES = {"llama": (LlamaConfig, LlamaForCausalLM), "mistral": (MistralConfig, MistralForCausalLM),
            "qwen2": (Qwen2Config, Qwen2ForCausalLM), "qwen3": (Qwen3Config, Qwen3ForCausalLM)}


def save_tiny(family: str, path, **extra):
    torch.manual_seed(0)
    config_class, model_class = FAMILIES[family]
    model = model_class(config_class(**SIZES, **extra)).eval()
    model.save_pretrained(path)
    return model


def logits(model, ids):
    with torch.no_grad():
        return model(ids, use_cache=False).logits.double()


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2"])
def test_local_layers_are_the_original_model_inside_the_window(family, tmp_path):
    """All-local conversion, window >= the sequence: the original model's logits (RoPE unchanged)."""
    source = save_tiny(family, tmp_path / "src")
    ids = torch.randint(3, 97, (2, 12), generator=torch.Generator().manual_seed(1))
    out = convert_llama(tmp_path / "src", tmp_path / "out", layer_pattern="L", local_window=12)
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    assert model.config.layer_pattern == "L" and model.config.local_window == 12
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


def test_refusals_are_one_line_naming_what_is_supported(tmp_path):
    save_tiny("qwen3", tmp_path / "qwen3")
    with pytest.raises(SystemExit, match=r"^tapa convert: error: Qwen3 cannot be converted: its QK-norm.*"
                                         r"supported: Llama, Mistral and Qwen2"):
        tapa_main(["convert", str(tmp_path / "qwen3"), str(tmp_path / "out")])
    config = json.loads((tmp_path / "qwen3" / "config.json").read_text())
    (tmp_path / "qwen3" / "config.json").write_text(json.dumps({**config, "model_type": "gemma"}))
    with pytest.raises(SystemExit, match=r"^tapa convert: error: model_type 'gemma' cannot be converted.*"
                                         r"supported: Llama, Mistral and Qwen2[^\n]*$"):
        tapa_main(["convert", str(tmp_path / "qwen3"), str(tmp_path / "out")])
    qwen2 = save_tiny("qwen2", tmp_path / "qwen2")
    with torch.no_grad():
        qwen2.model.layers[1].self_attn.k_proj.bias.fill_(0.5)
    qwen2.save_pretrained(tmp_path / "qwen2")
    with pytest.raises(SystemExit, match=r"k_proj.bias is not zero: TAPA's decoder has no biases"):
        tapa_main(["convert", str(tmp_path / "qwen2"), str(tmp_path / "out")])
    with pytest.raises(SystemExit, match=r"layer_pattern"):
        tapa_main(["convert", str(tmp_path / "qwen2"), str(tmp_path / "out"), "--layer-pattern", "LXG"])
