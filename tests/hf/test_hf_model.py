"""transformers integration: save/load, trust_remote_code, cached and padded generation, chunked
prefill, clear errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

pytest.importorskip("transformers")
from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402

from tapa.hf import TapaConfig, TapaForCausalLM  # noqa: E402
from tapa.hf.modeling import CACHE_OUTPUT_NAME  # noqa: E402
from tapa.model import ModelConfig, TapaLM  # noqa: E402

VOCAB = 97


def tiny_model(pe: str = "tapa", seed: int = 0, **overrides) -> TapaForCausalLM:
    """A tiny random model; init_std 0.3 makes greedy continuations vary from token to token.
    pe "tapa-hybrid": a local sliding-window layer (window 4, shorter than every test's text)
    then a global TAPA layer."""
    torch.manual_seed(seed)
    fields = dict(vocab_size=VOCAB, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, pe=pe, init_std=0.3)
    if pe == "tapa-hybrid":
        fields.update(pe="tapa", layer_pattern="LG", local_window=4)
    return TapaForCausalLM(TapaConfig(**{**fields, **overrides})).eval()


def random_ids(lengths, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(1, VOCAB, (n,), generator=gen) for n in lengths]


def left_pad(seqs):
    width = max(len(s) for s in seqs)
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, seq in enumerate(seqs):
        ids[row, width - len(seq):] = seq
        mask[row, width - len(seq):] = 1
    return ids, mask


def greedy(model, ids, **kwargs):
    out = model.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=0, **kwargs)
    return out[:, ids.shape[1]:]


def padded_batch_as_each_alone(model):
    """Three prompts of 5, 11 and 2 tokens, left-padded into one batch: each row's greedy tokens
    equal the prompt's alone. Returns (ids, mask, batched tokens)."""
    seqs = random_ids([5, 11, 2], seed=3)
    alone = [greedy(model, seq[None])[0] for seq in seqs]
    ids, mask = left_pad(seqs)
    batched = greedy(model, ids, attention_mask=mask)
    for row, expected in enumerate(alone):
        assert torch.equal(batched[row], expected), (row, batched[row], expected)
    return ids, mask, batched


def test_hf_logits_equal_tapa_lm_and_loss():
    model = tiny_model(phase_matrix="diagonal")
    ids = random_ids([13])[0][None]
    with torch.no_grad():
        assert torch.equal(model(ids).logits, model.model(ids))
        loss = model(ids, labels=ids).loss
        assert torch.allclose(loss, model.model.loss(ids[:, :-1], ids[:, 1:]))


@pytest.mark.parametrize("pe", ["tapa", "rope"])
def test_save_load_round_trip(tmp_path, pe):
    model = tiny_model(pe, tie_embeddings=pe == "tapa", phase_init_scale=0.1)
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").is_file()
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["model_type"] == "tapa-llama"
    assert {k: saved[k] for k in ModelConfig().to_dict()} == model.config.model_config().to_dict()
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert isinstance(loaded, TapaForCausalLM)
    assert loaded.config.model_config() == model.config.model_config()
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    assert (loaded.model.lm_head.weight is loaded.model.embed.weight) == (pe == "tapa")
    ids = random_ids([9])[0][None]
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)


@pytest.mark.parametrize("layout", [{}, {"attention_bias": True, "qk_norm": True, "head_dim": 24}])
def test_a_folder_of_the_layout_before_the_phase_split_loads(tmp_path, layout):
    """A folder whose TAPA layers hold one wq/wk (and bias) of every row, as written before the
    phase rows became parameters of their own, loads to the same logits."""
    model = tiny_model("tapa", phase_init_scale=0.5, **layout)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.normal_()
    model.save_pretrained(tmp_path)
    (tmp_path / "tapa_checksums.json").unlink()  # the file is rewritten below
    path = tmp_path / "model.safetensors"
    safetensors = pytest.importorskip("safetensors.torch")
    state = safetensors.load_file(str(path))
    for name in [n for n in state if "_phase." in n]:
        main = name.replace("_phase.", ".")
        heads = model.config.n_heads if ".wq" in name else model.config.n_kv_heads
        rest = state[main].shape[1:]  # (dim,) for a weight, () for a bias
        whole = torch.cat([state[main].reshape(heads, -1, *rest), state.pop(name).reshape(heads, -1, *rest)], 1)
        state[main] = whole.reshape(-1, *rest)
    safetensors.save_file(state, str(path), metadata={"format": "pt"})
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    ids = random_ids([9])[0][None]
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)


def test_trust_remote_code_without_importing_tapa(tmp_path):
    model = tiny_model()
    model.save_pretrained(tmp_path)
    ids = random_ids([7])[0][None]
    with torch.no_grad():
        torch.save({"ids": ids, "logits": model(ids).logits}, tmp_path / "expected.pt")
    script = textwrap.dedent(f"""
        import sys, torch
        torch.set_num_threads({torch.get_num_threads()})  # the expected logits' own: bitwise equal
        from transformers import AutoModelForCausalLM
        assert "tapa" not in sys.modules
        model = AutoModelForCausalLM.from_pretrained({str(tmp_path)!r}, trust_remote_code=True).eval()
        expected = torch.load({str(tmp_path / "expected.pt")!r})
        with torch.no_grad():
            assert torch.equal(model(expected["ids"]).logits, expected["logits"])
        print("remote code ok", type(model).__name__)
    """)
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                            cwd=tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "remote code ok TapaForCausalLM" in result.stdout


@pytest.mark.parametrize("pe", ["tapa", "rope", "tapa-linear-phase", "tapa-hybrid"])
def test_generate_with_cache_equals_without(pe):
    model = tiny_model(pe)
    ids = torch.stack(random_ids([10, 10], seed=2))
    cached = greedy(model, ids)
    uncached = greedy(model, ids, use_cache=False)
    assert torch.equal(cached, uncached)
    assert torch.equal(greedy(model, ids, cache_implementation="static"), uncached)
    assert len(set(cached.flatten().tolist())) > 3  # a real continuation, not one repeated token


@pytest.mark.parametrize("pe", ["tapa", "rope", "tapa-hybrid"])
def test_transformers_generate_equals_the_static_decoder(pe):
    """README: the TapaLM inside (`model.model`) decodes unpadded prompts through StaticDecoder
    (one CUDA graph on a GPU); its greedy tokens are transformers' generate's."""
    model = tiny_model(pe)
    ids = torch.stack(random_ids([10, 10], seed=3))
    assert torch.equal(model.model.generate(ids, max_new_tokens=8), greedy(model, ids))


@pytest.mark.parametrize("implementation", ["dynamic", "static"])
def test_hybrid_local_layers_cache_only_their_window(implementation):
    """transformers' caches built from the config keep a local layer's last local_window tokens
    only; a global layer keeps all; the logits match the uncached forward either way."""
    from transformers import DynamicCache, StaticCache

    model = tiny_model("tapa-hybrid", n_layers=4).double()
    assert model.config.layer_types == ["sliding_attention", "full_attention"] * 2
    assert model.config.sliding_window == 4 and tiny_model("tapa").config.sliding_window is None
    ids = torch.stack(random_ids([19], seed=9))
    cache = (DynamicCache(config=model.config) if implementation == "dynamic"
             else StaticCache(config=model.config, max_cache_len=32))
    with torch.no_grad():
        logits = [model(ids[:, :11], cache=cache).logits]
        logits += [model(ids[:, n:n + 1], cache=cache).logits for n in range(11, 19)]
        whole = model(ids, use_cache=False).logits
    torch.testing.assert_close(torch.cat(logits, dim=1), whole, rtol=1e-10, atol=1e-10)
    held = [layer.keys.shape[2] for layer in cache.layers]
    assert max(held[0], held[2]) <= 4 and min(held[1], held[3]) >= 19, held
    with pytest.raises(ValueError, match="contradicts"):
        TapaConfig(layer_pattern="LG", local_window=4, sliding_window=8)
    with pytest.raises(ValueError, match="contradicts"):
        TapaConfig(layer_types=["sliding_attention"] * 8)


@pytest.mark.parametrize("pe", ["tapa", "rope", "nope", "tapa-hybrid"])
def test_left_padded_batch_generates_as_each_sequence_alone(pe):
    # the learnable phase matrix exists only where a global layer is TAPA
    model = tiny_model(pe, phase_matrix="full" if pe.startswith("tapa") else "none")
    ids, mask, batched = padded_batch_as_each_alone(model)
    assert torch.equal(greedy(model, ids, attention_mask=mask, use_cache=False), batched)
    assert torch.equal(greedy(model, ids, attention_mask=mask, cache_implementation="static"), batched)


@pytest.mark.parametrize("pe", ["tapa", "rope", "tapa-hybrid"])
def test_mask_with_holes_equals_sequence_without_them(pe):
    """A 0 inside the mask hides that token: the other tokens' logits equal those of the sequence
    with the token removed (positions restart from the mask's cumsum). Row 1 is left-padded."""
    model = tiny_model(pe).double()  # float64: the comparison is then exact up to ~1e-12
    ids = torch.stack(random_ids([12, 12], seed=4))
    mask = torch.ones_like(ids)
    mask[0, [3, 7]] = 0
    mask[1, :4] = 0
    with torch.no_grad():
        masked = model(ids, attention_mask=mask, use_cache=False).logits
        for row in range(2):
            keep = mask[row].bool()
            removed = model(ids[row:row + 1, keep], use_cache=False).logits[0]
            torch.testing.assert_close(masked[row, keep], removed, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("pe", ["tapa", "rope", "tapa-hybrid"])
@pytest.mark.parametrize("padded", [False, True])
def test_chunked_prefill_equals_one_shot(pe, padded):
    model = tiny_model(pe).double()
    seqs = random_ids([23, 17], seed=5)
    ids, mask = left_pad(seqs)
    if not padded:
        ids, mask = ids[:1], None
    with torch.no_grad():
        one_shot = model(ids, attention_mask=mask).logits
        cache, chunks = None, []
        for start in range(0, ids.shape[1], 7):
            stop = min(start + 7, ids.shape[1])
            chunk_mask = None if mask is None else mask[:, :stop]
            out = model(ids[:, start:stop], attention_mask=chunk_mask, cache=cache, use_cache=True)
            cache = out[CACHE_OUTPUT_NAME]
            chunks.append(out.logits)
    chunked = torch.cat(chunks, dim=1)
    real = torch.ones_like(ids, dtype=torch.bool) if mask is None else mask.bool()
    torch.testing.assert_close(chunked[real], one_shot[real], rtol=1e-10, atol=1e-10)


def test_bad_inputs(tmp_path):
    with pytest.raises(ValueError, match="pe must be one of"):
        TapaConfig(pe="alibi")
    with pytest.raises(ValueError, match="contradicts"):
        TapaConfig(dim=64, hidden_size=128)
    # a config of another model type
    other = tmp_path / "llama"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    with pytest.raises(ValueError, match="model_type is 'llama'.*tapa convert"):
        TapaConfig.from_pretrained(other)
    with pytest.raises(ValueError, match="model_type is 'llama'"):
        TapaForCausalLM.from_pretrained(other)
    unknown = tmp_path / "unknown"
    unknown.mkdir()
    (unknown / "config.json").write_text(json.dumps({"model_type": "no-such-model"}))
    with pytest.raises(ValueError, match="no-such-model"):
        AutoConfig.from_pretrained(unknown)
    # weights that do not fit the config
    saved = tmp_path / "model"
    tiny_model().save_pretrained(saved)
    config = json.loads((saved / "config.json").read_text())
    config["ffn_dim"] = 128
    (saved / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="does not match its config.*ffn"):
        AutoModelForCausalLM.from_pretrained(saved)
    model = tiny_model()
    with pytest.raises(ValueError, match="attention_mask must be"):
        model(torch.ones(2, 5, dtype=torch.long), attention_mask=torch.ones(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="4D attention masks"):
        model(torch.ones(2, 5, dtype=torch.long), attention_mask=torch.ones(2, 1, 5, 5))


def test_tapa_lm_weights_wrap_exactly():
    torch.manual_seed(0)
    lm = TapaLM(ModelConfig(vocab_size=VOCAB, dim=64, n_layers=2, n_heads=4, pe="tapa")).eval()
    wrapped = TapaForCausalLM.from_tapa_lm(lm).eval()
    ids = random_ids([8])[0][None]
    with torch.no_grad():
        assert torch.equal(wrapped(ids).logits, lm(ids))


DECODE_KERNEL_SCRIPT = """
import torch
from tapa.hf import TapaConfig, TapaForCausalLM
from tapa.ops.tapa import decode_kernel

calls = []
real = decode_kernel.tapa_decode_attention
decode_kernel.tapa_decode_attention = lambda *a, **k: calls.append(1) or real(*a, **k)
fields = dict(vocab_size=97, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, init_std=0.3)
torch.manual_seed(0)
fast = TapaForCausalLM(TapaConfig(**fields, attn_impl="triton")).eval()
exact = TapaForCausalLM(TapaConfig(**fields, attn_impl="reference")).eval()
exact.load_state_dict(fast.state_dict())
gen = torch.Generator().manual_seed(7)
ids = torch.randint(1, 97, (3, 9), generator=gen)
mask = torch.ones_like(ids)
mask[0, :4] = 0
mask[2, :7] = 0
args = dict(attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
assert torch.equal(fast.generate(ids, **args), exact.generate(ids, **args))
assert calls, "the decode kernel was not used"
print("decode kernel generation ok", len(calls))
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU interpreter check; CUDA has its own test")
def test_generation_through_decode_kernel_in_interpreter():
    """attn_impl="triton" sends decoding (and short prefills) to the split-KV kernel; under the
    Triton interpreter a left-padded batch generates the same tokens as the reference path."""
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    result = subprocess.run([sys.executable, "-c", DECODE_KERNEL_SCRIPT], capture_output=True,
                            text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "decode kernel generation ok" in result.stdout


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_generation_uses_decode_kernel(monkeypatch):
    from tapa.ops.tapa import decode_kernel

    calls = []
    real = decode_kernel.tapa_decode_attention
    monkeypatch.setattr(decode_kernel, "tapa_decode_attention",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    model = tiny_model().cuda()
    seqs = [s.cuda() for s in random_ids([6, 9], seed=6)]
    ids, mask = left_pad(seqs)
    ids, mask = ids.cuda(), mask.cuda()
    batched = greedy(model, ids, attention_mask=mask)
    assert calls, "the decode kernel was not used"
    for row, seq in enumerate(seqs):
        assert torch.equal(batched[row], greedy(model, seq[None], use_cache=False)[0])


@pytest.mark.parametrize("pe", ["tapa", "rope", "tapa-hybrid"])
def test_left_padded_batch_with_an_empty_prompt(pe):
    """generate gives an all-padding row's first real token position 1: TAPA (distances only) takes
    a constant shift of position_ids. The real row generates as alone; the empty row, from its
    first generated token on, continues as that token alone would."""
    model = tiny_model(pe)
    seq = random_ids([6], seed=7)[0]
    ids = torch.stack([torch.zeros(6, dtype=torch.long), seq])
    mask = torch.stack([torch.zeros(6, dtype=torch.long), torch.ones(6, dtype=torch.long)])
    batched = greedy(model, ids, attention_mask=mask)
    assert torch.equal(batched[1], greedy(model, seq[None])[0])
    first = batched[0, :1][None]
    assert torch.equal(batched[0, 1:], greedy(model, first)[0, :7])


def test_tapa_rejects_position_ids_that_are_not_a_shift_of_the_mask_positions():
    model = tiny_model("tapa")
    ids = torch.stack(random_ids([5, 5], seed=8))
    with pytest.raises(ValueError, match="position_ids disagree"):
        model(ids, position_ids=torch.tensor([[0, 1, 2, 3, 4], [0, 1, 3, 4, 5]]))
    shifted = model(ids, position_ids=torch.arange(5)[None] + torch.tensor([[0], [9]])).logits
    torch.testing.assert_close(shifted, model(ids).logits)


def test_forward_refuses_outputs_it_does_not_produce_and_names_ignored_arguments():
    """output_hidden_states=True used to return hidden_states=None, and a misspelt argument
    (attention_maks) ran the forward unmasked, both without a word."""
    model = tiny_model()
    ids = torch.randint(1, VOCAB, (2, 5))
    with pytest.raises(ValueError, match="output_hidden_states=True"):
        model(ids, output_hidden_states=True)
    with pytest.raises(ValueError, match="output_attentions=True"):
        model(ids, output_attentions=True)
    with pytest.warns(UserWarning, match=r"forward ignores the arguments \['attention_maks'\]"):
        model(ids, attention_maks=torch.ones_like(ids))
    import warnings

    with warnings.catch_warnings():  # what generate passes is taken without a word
        warnings.simplefilter("error")
        model(ids, output_attentions=False, output_hidden_states=False, return_dict=True, use_cache=True)
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=2, do_sample=False)


@pytest.mark.parametrize("pe", ["tapa-hybrid", "nope"])
def test_query_temperature_survives_caches_padding_and_the_static_decoder(pe):
    """The global layers' query temperature (base 4: every position from 3 on is scaled) is read
    from the position, not the slot: cached, static-cache, uncached, left-padded and the bare
    model's static decoder all agree, and the temperature changes the continuation."""
    model = tiny_model(pe, query_temperature_base=4, query_temperature_scale=2.0)
    assert model.model.config.query_temperature_base == 4
    ids = torch.stack(random_ids([10, 10], seed=2))
    cached = greedy(model, ids)
    assert torch.equal(greedy(model, ids, use_cache=False), cached)
    assert torch.equal(greedy(model, ids, cache_implementation="static"), cached)
    assert torch.equal(model.model.generate(ids, max_new_tokens=8), cached)
    assert not torch.equal(greedy(tiny_model(pe), ids), cached)  # the same weights without it
    padded_batch_as_each_alone(model)


def test_query_temperature_turned_on_at_load_for_a_model_trained_without_it(tmp_path):
    """A checkpoint saved without the temperature, loaded with it (the eval-only lever served):
    from_pretrained's config overrides reach the model, which then generates as one built with
    it; a bad value is ModelConfig's error, not a silent setting."""
    model = tiny_model("tapa-hybrid")
    model.save_pretrained(tmp_path)
    turned_on = AutoModelForCausalLM.from_pretrained(tmp_path, query_temperature_base=4,
                                                     query_temperature_scale=2.0).eval()
    assert turned_on.model.config.query_temperature_base == 4
    ids = torch.stack(random_ids([10, 10], seed=2))
    built_with = tiny_model("tapa-hybrid", query_temperature_base=4, query_temperature_scale=2.0)
    assert torch.equal(greedy(turned_on, ids), greedy(built_with, ids))
    assert not torch.equal(greedy(turned_on, ids), greedy(model, ids))
    with pytest.raises(ValueError, match="query_temperature_base must be an int >= 0"):
        AutoModelForCausalLM.from_pretrained(tmp_path, query_temperature_base=-3)
