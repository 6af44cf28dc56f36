"""The decoder with every positional encoding: shapes, gradients, learning, cache, TAPA options."""

import pytest
import torch

from tapa.model import PE_CHOICES, KVCache, ModelConfig, TapaLM
from tapa.ops import split_dims

VOCAB = 97


def tiny_config(**overrides):
    values = dict(vocab_size=VOCAB, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, original_seq_len=16)
    values.update(overrides)
    return ModelConfig(**values)


@pytest.mark.parametrize("pe", list(PE_CHOICES))
def test_forward_backward_and_learning(pe):
    torch.manual_seed(0)
    model = TapaLM(tiny_config(pe=pe))
    ids = torch.randint(0, VOCAB, (2, 33))
    logits = model(ids)
    assert logits.shape == (2, 33, VOCAB) and torch.isfinite(logits).all()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(12):
        loss = model.loss(ids[:, :-1], ids[:, 1:])
        optimizer.zero_grad()
        loss.backward()
        assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0]


@pytest.mark.parametrize("pe", ["tapa", "tapa-linear-phase", "rope", "rope-yarn", "nope"])
def test_kv_cache_matches_full_forward(pe):
    torch.manual_seed(1)
    model = TapaLM(tiny_config(pe=pe, rope_scale=2.0)).eval()
    ids = torch.randint(0, VOCAB, (2, 29))
    with torch.no_grad():
        full = model(ids)
        cache = model.new_kv_cache(2, 29)
        pieces = [model(ids[:, :20], 0, cache)]
        for pos in range(20, 29):  # one token at a time, as in generation
            pieces.append(model(ids[:, pos:pos + 1], pos, cache))
    torch.testing.assert_close(torch.cat(pieces, 1), full, atol=2e-5, rtol=1e-4)


def test_causal_future_tokens_do_not_change_past_logits():
    torch.manual_seed(2)
    model = TapaLM(tiny_config()).eval()
    ids = torch.randint(0, VOCAB, (1, 24))
    changed = ids.clone()
    changed[0, 15:] = (changed[0, 15:] + 1) % VOCAB
    with torch.no_grad():
        torch.testing.assert_close(model(ids)[:, :15], model(changed)[:, :15])
        assert not torch.allclose(model(ids)[:, 15:], model(changed)[:, 15:])


def test_phase_init_scale_scales_only_phase_rows():
    torch.manual_seed(3)
    scaled = TapaLM(tiny_config(phase_init_scale=0.1))
    torch.manual_seed(3)
    plain = TapaLM(tiny_config(phase_init_scale=1.0))
    for name in ("wq", "wk", "wv"):
        torch.testing.assert_close(getattr(scaled.layers[0].attn, name).weight,
                                   getattr(plain.layers[0].attn, name).weight)
    for name in ("wq_phase", "wk_phase"):
        torch.testing.assert_close(getattr(scaled.layers[0].attn, name).weight,
                                   0.1 * getattr(plain.layers[0].attn, name).weight)


def test_phase_rows_are_their_own_parameters_and_old_checkpoints_load():
    """The phase rows of W_q/W_k are separate parameters (own learning rate), and a state dict of
    the earlier layout (one wq/wk with every head's amplitude then phase rows) loads exactly."""
    from tapa.model import is_phase_parameter

    torch.manual_seed(5)
    model = TapaLM(tiny_config()).eval()
    names = [name for name, _ in model.named_parameters() if is_phase_parameter(name)]
    assert names == [f"layers.{i}.attn.{p}.weight" for i in range(2) for p in ("wq_phase", "wk_phase")]
    assert is_phase_parameter("module._orig_mod.layers.0.attn.phase_matrix")
    assert not is_phase_parameter("layers.0.attn.wq.weight")
    old = {}
    for name, tensor in model.state_dict().items():
        if "_phase" in name:
            continue
        if name.endswith(("attn.wq.weight", "attn.wk.weight")):
            attn = model.layers[int(name.split(".")[1])].attn
            phase = getattr(attn, name.split(".")[-2] + "_phase").weight
            heads = tensor.shape[0] // attn.amp_dim
            tensor = torch.cat([tensor.view(heads, attn.amp_dim, -1), phase.view(heads, -1, tensor.shape[1])], 1)
            tensor = tensor.reshape(-1, tensor.shape[-1])
        old[name] = tensor.clone()
    loaded = TapaLM(tiny_config())
    loaded.load_state_dict(old)
    ids = torch.randint(0, VOCAB, (2, 17))
    with torch.no_grad():
        torch.testing.assert_close(loaded.eval()(ids), model(ids), atol=0, rtol=0)


@pytest.mark.parametrize("kind", ["diagonal", "full"])
def test_phase_matrix_starts_as_identity_and_learns(kind):
    torch.manual_seed(4)
    with_matrix = TapaLM(tiny_config(phase_matrix=kind))
    torch.manual_seed(4)
    without = TapaLM(tiny_config())
    ids = torch.randint(0, VOCAB, (2, 17))
    torch.testing.assert_close(with_matrix(ids), without(ids))
    with_matrix.loss(ids[:, :-1], ids[:, 1:]).backward()
    grad = with_matrix.layers[0].attn.phase_matrix.grad
    assert grad is not None and grad.abs().sum() > 0


def test_parameter_count_counts_tied_weights_once():
    cfg = tiny_config()
    model = TapaLM(cfg)
    hd = cfg.head_dim
    per_layer = (cfg.dim * hd * (cfg.n_heads * 2 + cfg.n_kv_heads * 2) + 3 * cfg.dim * cfg.ffn_dim
                 + 2 * cfg.dim)
    expected = VOCAB * cfg.dim + cfg.n_layers * per_layer + cfg.dim
    assert model.num_parameters() == expected
    assert model.num_parameters(exclude_embeddings=True) == expected - VOCAB * cfg.dim
    untied = TapaLM(tiny_config(tie_embeddings=False))
    assert untied.num_parameters() == expected + VOCAB * cfg.dim


def test_set_rope_scale_changes_scaled_methods_only():
    torch.manual_seed(5)
    ids = torch.randint(0, VOCAB, (1, 40))
    for pe, should_change in (("rope-pi", True), ("rope-yarn", True), ("rope-ntk", True),
                              ("rope", False), ("tapa", False)):
        model = TapaLM(tiny_config(pe=pe)).eval()
        with torch.no_grad():
            before = model(ids)
            model.set_rope_scale(4.0)
            after = model(ids)
        assert (not torch.allclose(before, after)) == should_change, pe


@pytest.mark.parametrize("overrides, match", [
    (dict(pe="alibi"), "pe"),
    (dict(dim=66), "divisible"),
    (dict(n_kv_heads=3), "n_kv_heads"),
    (dict(theta=0.0), "theta"),
    (dict(alpha=-1.0), "alpha"),
    (dict(distance="log"), "distance"),
    (dict(phase_matrix="dense"), "phase_matrix"),
    (dict(attn_impl="cuda"), "attn_impl"),
    (dict(n_layers=0), "n_layers"),
    # these built a model whose outputs were inf/nan-born garbage, without an error
    (dict(pe="rope", rope_base=0.0), r"rope_base must be > 0, got 0.0"),
    (dict(pe="rope", rope_base=-1.0), r"rope_base must be > 0"),
    (dict(norm_eps=-1.0), r"norm_eps must be >= 0"),
])
def test_bad_config_is_a_clear_error(overrides, match):
    with pytest.raises(ValueError, match=match):
        tiny_config(**overrides)


@pytest.mark.parametrize("overrides, ignored", [
    (dict(pe="rope", theta=0.75), "theta=0.75"),
    (dict(pe="nope", alpha=0.5, phase_matrix="diagonal"), "alpha=0.5, phase_matrix='diagonal'"),
    (dict(pe="tapa", layer_pattern="LL", theta=0.75), "theta=0.75"),  # no global layer is TAPA
])
def test_settings_no_layer_reads_are_a_warning(overrides, ignored):
    """A TAPA setting on a model without a global TAPA layer used to be ignored without a word."""
    with pytest.warns(UserWarning, match=f"ModelConfig: {ignored} set, but .* they are ignored"):
        tiny_config(**overrides)


def test_settings_every_layer_kind_reads_raise_no_warning():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tiny_config(pe="tapa", theta=0.75, alpha=0.5)
        tiny_config(pe="rope", layer_pattern="LG", local_window=8, rope_base=500.0)
        tiny_config(pe="rope")  # defaults of the TAPA settings are not "set"
        tiny_config(pe="rope", phase_init_scale=1.0, local_window=16)  # as the demo sets every model


def test_config_round_trip_and_unknown_fields():
    cfg = tiny_config(pe="rope-yarn", rope_scale=4.0)
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="unknown"):
        ModelConfig.from_dict({**cfg.to_dict(), "n_layer": 3})


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("pe", ["tapa", "rope"])
def test_bf16_autocast_on_gpu(pe):
    model = TapaLM(tiny_config(pe=pe)).cuda()
    ids = torch.randint(0, VOCAB, (2, 64), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model.loss(ids[:, :-1], ids[:, 1:])
    loss.backward()
    assert torch.isfinite(loss)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU interpreter check of the CPU-built model")
def test_unpadded_decoding_takes_the_kernel_without_a_length_sync(monkeypatch):
    """A global TAPA layer's decode step builds its cache lengths itself (every row full), so it
    skips the value check of the lengths: that check is a device sync per layer and per step."""
    pytest.importorskip("triton")
    from tapa.eval.passkey_eval import greedy_generate
    from tapa.ops import decode as decode_op
    from tapa.ops import decode_kernel

    synced, kernel_calls = [], []
    monkeypatch.setattr(decode_op, "check_cache_lengths", lambda *a: synced.append(a))
    real = decode_kernel.tapa_decode_attention
    monkeypatch.setattr(decode_kernel, "tapa_decode_attention",
                        lambda *a, **k: kernel_calls.append(1) or real(*a, **k))
    torch.manual_seed(2)
    fast = TapaLM(tiny_config(pe="tapa", attn_impl="triton")).eval()
    exact = TapaLM(tiny_config(pe="tapa", attn_impl="reference")).eval()
    exact.load_state_dict(fast.state_dict())
    ids = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(3))
    assert torch.equal(greedy_generate(fast, ids, 5), greedy_generate(exact, ids, 5))
    assert kernel_calls and not synced
