"""`tapa convert` (Llama -> TAPA) and `tapa export` (training checkpoint -> transformers)."""

from __future__ import annotations

import json
import math

import pytest
import torch

transformers = pytest.importorskip("transformers")
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM  # noqa: E402

from helpers import rel_rmse  # noqa: E402

from tapa.cli import main as tapa_main  # noqa: E402
from tapa.hf import TapaForCausalLM  # noqa: E402
from tapa.hf.convert import convert_llama, low_frequency_first  # noqa: E402
from tapa.ops import split_dims  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM = 4, 2, 16


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=97, hidden_size=HEADS * HEAD_DIM, intermediate_size=96,
                         num_hidden_layers=2, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                         initializer_range=0.2, tie_word_embeddings=False, eos_token_id=2, bos_token_id=1)
    model = LlamaForCausalLM(config).eval()
    path = tmp_path_factory.mktemp("llama")
    model.save_pretrained(path)
    return path


@torch.no_grad()
def llama_without_rotary(llama: LlamaForCausalLM, ids: torch.Tensor, amp_dims: torch.Tensor):
    """Hand-built reference: Llama's layers, but attention is plain causal softmax on the given
    head dims of q and k, scaled by 1/sqrt(head_dim), with no rotary embedding."""
    x = llama.model.embed_tokens(ids)
    batch, length, _ = x.shape
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    for layer in llama.model.layers:
        h = layer.input_layernorm(x)
        q = layer.self_attn.q_proj(h).view(batch, length, HEADS, HEAD_DIM)[..., amp_dims]
        k = layer.self_attn.k_proj(h).view(batch, length, KV_HEADS, HEAD_DIM)[..., amp_dims]
        v = layer.self_attn.v_proj(h).view(batch, length, KV_HEADS, HEAD_DIM)
        k = k.repeat_interleave(HEADS // KV_HEADS, dim=2)
        v = v.repeat_interleave(HEADS // KV_HEADS, dim=2)
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(HEAD_DIM)
        probs = scores.masked_fill(~causal, float("-inf")).softmax(-1)
        out = torch.einsum("bhqk,bkhd->bqhd", probs, v).reshape(batch, length, -1)
        x = x + layer.self_attn.o_proj(out)
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    return llama.lm_head(llama.model.norm(x))


@pytest.mark.parametrize("theta, phase", [(0.5, "quadratic"), (0.25, "linear")])
def test_converted_llama_with_phase_off_is_llama_without_rotary(llama_dir, tmp_path, theta, phase):
    out = convert_llama(llama_dir, tmp_path / "tapa", theta=theta, phase=phase, phase_init_scale=0.0)
    tapa = AutoModelForCausalLM.from_pretrained(out).double().eval()
    llama = LlamaForCausalLM.from_pretrained(llama_dir).double().eval()
    amp_dim, _ = split_dims(HEAD_DIM, theta)
    amp_dims = low_frequency_first(HEAD_DIM)[:amp_dim]
    ids = torch.randint(0, 97, (2, 19), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = llama_without_rotary(llama, ids, amp_dims)
        actual = tapa(ids, use_cache=False).logits
    if theta == 0.25:  # sqrt(d_A / D) = 1/2: the rescaled float32 weights are exact
        torch.testing.assert_close(actual, expected, rtol=1e-10, atol=1e-10)
    else:  # the amplitude rows of W_q were rescaled by sqrt(1/2) in float32
        assert rel_rmse(actual, expected) < 1e-6
    # the check can fail: the first amp_dim dims in Llama's own order give other logits
    wrong = llama_without_rotary(llama, ids, torch.arange(amp_dim))
    assert not torch.allclose(wrong, expected, atol=1e-3)


def test_convert_keeps_every_weight_then_generates(llama_dir, tmp_path):
    assert tapa_main(["convert", str(llama_dir), str(tmp_path / "tapa"), "--theta", "0.5",
                      "--alpha", "0.1", "--phase-init-scale", "0.5"]) == 0
    tapa = AutoModelForCausalLM.from_pretrained(tmp_path / "tapa").eval()
    assert isinstance(tapa, TapaForCausalLM)
    assert tapa.config.phase_init_scale == 0.5 and tapa.config.rope_base == 10000.0
    llama = LlamaForCausalLM.from_pretrained(llama_dir).eval()
    order = low_frequency_first(HEAD_DIM)
    for i, (ours, theirs) in enumerate(zip(tapa.model.layers, llama.model.layers)):
        assert torch.equal(ours.attn.wv.weight, theirs.self_attn.v_proj.weight)
        assert torch.equal(ours.attn.wo.weight, theirs.self_attn.o_proj.weight)
        assert torch.equal(ours.ffn.w_down.weight, theirs.mlp.down_proj.weight)
        assert torch.equal(ours.attn_norm.weight, theirs.input_layernorm.weight)
        k_rows = theirs.self_attn.k_proj.weight.view(KV_HEADS, HEAD_DIM, -1)[:, order]
        ours_k = ours.attn.projection_weight("k").view(KV_HEADS, HEAD_DIM, -1)
        torch.testing.assert_close(ours_k[:, :8], k_rows[:, :8], rtol=0, atol=0)
        torch.testing.assert_close(ours_k[:, 8:], 0.5 * k_rows[:, 8:], rtol=0, atol=0)
    assert torch.equal(tapa.model.lm_head.weight, llama.lm_head.weight)
    ids = torch.randint(3, 97, (1, 6), generator=torch.Generator().manual_seed(2))
    generated = tapa.generate(ids, max_new_tokens=5, do_sample=False)
    assert generated.shape == (1, 11)
    assert torch.equal(generated, tapa.generate(ids, max_new_tokens=5, do_sample=False, use_cache=False))


def test_convert_refuses_what_tapa_cannot_represent(llama_dir, tmp_path):
    config = json.loads((llama_dir / "config.json").read_text())
    bad = tmp_path / "biased"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps({**config, "mlp_bias": True}))
    with pytest.raises(ValueError, match="mlp_bias=True: TAPA's decoder has no MLP biases"):
        convert_llama(bad, tmp_path / "out")
    (bad / "config.json").write_text(json.dumps({**config, "model_type": "gpt2"}))
    with pytest.raises(ValueError, match="expected a Llama config"):
        convert_llama(bad, tmp_path / "out")
    (bad / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="no model.safetensors"):
        convert_llama(bad, tmp_path / "out")


@pytest.mark.parametrize("layout", [{}, {"attention_bias": True, "qk_norm": True}])
def test_export_training_run_is_lossless(tmp_path, layout):
    """Train a few steps, export, reload with transformers: identical logits, a working tokenizer
    (also with Qwen2's q/k/v biases and Qwen3's QK-norm)."""
    from tapa.data import DataConfig
    from tapa.model import ModelConfig
    from tapa.model.loading import load_model
    from tapa.train.config import TrainConfig
    from tapa.train.trainer import train

    run_dir = train(
        TrainConfig(name="export", run_dir=str(tmp_path / "run"), seq_len=32, batch_size=4, steps=2,
                    lr=3e-3, warmup_steps=1, eval_every=2, eval_batches=1, save_every=2, log_every=1,
                    progress=False, plot=False, device="cpu"),
        ModelConfig(dim=32, n_layers=2, n_heads=2, phase_init_scale=0.1, phase_matrix="diagonal", **layout),
        DataConfig(source="builtin", cache_dir=str(tmp_path / "cache"), vocab_size=300,
                   max_train_bytes=200_000))
    out = tmp_path / "hf"
    assert tapa_main(["export", str(run_dir), str(out)]) == 0
    lm, _, _ = load_model(run_dir)
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    for name, tensor in lm.state_dict().items():
        assert torch.equal(model.model.state_dict()[name], tensor), name
    tokenizer = AutoTokenizer.from_pretrained(out)
    ids = tokenizer("def add(a, b):\n    return a + b\n", return_tensors="pt").input_ids
    with torch.no_grad():
        assert torch.equal(model(ids).logits, lm(ids))
    assert tokenizer.eos_token_id == model.generation_config.eos_token_id
    text = tokenizer.decode(model.generate(ids, max_new_tokens=4, do_sample=False)[0])
    assert text.startswith("def add(a, b):")
    with pytest.raises(SystemExit, match="^tapa export: error: .*does not exist"):
        tapa_main(["export", str(tmp_path / "no-run"), str(tmp_path / "x")])
