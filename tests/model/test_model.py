"""The decoder with every positional encoding: shapes, gradients, learning, cache, TAPA options."""

import pytest
import torch

from tapa.model import PE_CHOICES, ModelConfig, TapaLM

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
        steps = _decode(model, ids, 20)  # one token at a time after the prompt, as in generation
    torch.testing.assert_close(steps, full, atol=2e-5, rtol=1e-4)


# global softmax layers (RoPE family, NoPE), alone and beside local ones; original_seq_len 8, so
# that the prompts are past it and YaRN / dynamic NTK change the frequencies
SOFTMAX_DECODING = {
    "rope": dict(pe="rope"),
    "rope-yarn": dict(pe="rope-yarn", rope_scale=4.0),
    "rope-dynamic-ntk": dict(pe="rope-dynamic-ntk", rope_scale=4.0),
    "nope": dict(pe="nope"),
    "hybrid-rope": dict(pe="rope", n_layers=4, layer_pattern="LG", local_window=5),
    "hybrid-nope": dict(pe="nope", n_layers=4, layer_pattern="LLLG", local_window=5),
}


def _decode(model, ids, prompt, attention_mask=None, chunk=1):
    """Logits of ids (B, N): the first `prompt` tokens in one pass through a new KVCache, then
    `chunk` tokens per forward; attention_mask (B, N) is cut to the slots of each call."""
    cache = model.new_kv_cache(ids.shape[0], ids.shape[1])
    pieces = []
    for start in [0, *range(prompt, ids.shape[1], chunk)]:
        stop = prompt if start == 0 else min(start + chunk, ids.shape[1])
        mask = None if attention_mask is None else attention_mask[:, :stop]
        pieces.append(model(ids[:, start:stop], start, cache, attention_mask=mask))
    return torch.cat(pieces, dim=1)


def _spy_softmax(monkeypatch):
    """Records (mask given, is_causal, cuDNN SDPA enabled) of every softmax attention call."""
    from tapa.model import attention

    calls, real = [], attention._softmax

    def spy(q, k, v, mask=None, is_causal=False):
        calls.append((mask is not None, is_causal, torch.backends.cuda.cudnn_sdp_enabled()))
        return real(q, k, v, mask=mask, is_causal=is_causal)

    monkeypatch.setattr(attention, "_softmax", spy)
    return calls


@pytest.mark.parametrize("name", sorted(SOFTMAX_DECODING))
@torch.no_grad()
def test_one_token_decoding_takes_no_mask_and_gives_the_full_forward(name, monkeypatch):
    """A new token with no padding sees every cached key: its global softmax layers call SDPA
    without a mask and without cuDNN (a plan per key length); the prefill stays causal on torch's
    own choice of backend. The logits equal the full forward's (float32), also for chunks of 3
    tokens, which need the mask. Dynamic NTK rotates each key at the length it was cached at, so
    it has no full-forward twin: the padded-batch test below holds it against the masked path."""
    torch.manual_seed(1)
    model = TapaLM(tiny_config(original_seq_len=8, **SOFTMAX_DECODING[name])).eval()
    ids = torch.randint(0, VOCAB, (2, 29), generator=torch.Generator().manual_seed(2))
    calls = _spy_softmax(monkeypatch)
    steps = _decode(model, ids, 20)
    globals_ = sum(model.config.layer_kind(i) == "global" for i in range(model.config.n_layers))
    assert calls.count((False, False, False)) == 9 * globals_, calls  # 9 steps: no mask, no cuDNN
    assert calls.count((False, True, True)) == globals_, calls  # the prefill
    if name != "rope-dynamic-ntk":
        full = model(ids)
        torch.testing.assert_close(steps, full, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(_decode(model, ids, 20, chunk=3), full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", sorted(SOFTMAX_DECODING))
@torch.no_grad()
def test_left_padded_decoding_equals_each_sequence_alone(name, monkeypatch):
    """One token at a time after a left-padded prompt: the global layers' masked path (a padding
    mask; still no cuDNN, which only they turn off) gives each row the logits of its sequence
    decoded alone, which takes no mask (float32).
    Row 0 is unpadded, so the mask is all it differs by; row 1's positions restart at its first
    real token, and dynamic NTK takes each row's own length."""
    torch.manual_seed(3)
    model = TapaLM(tiny_config(original_seq_len=8, **SOFTMAX_DECODING[name])).eval()
    seqs = [torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(n)) for n in (27, 20)]
    ids = torch.zeros(2, 27, dtype=torch.long)
    mask = torch.zeros(2, 27, dtype=torch.long)
    for row, seq in enumerate(seqs):
        ids[row, 27 - len(seq):], mask[row, 27 - len(seq):] = seq, 1
    calls = _spy_softmax(monkeypatch)
    batched = _decode(model, ids, 18, attention_mask=mask)
    globals_ = sum(model.config.layer_kind(i) == "global" for i in range(model.config.n_layers))
    assert [call for call in calls if not call[2]] == [(True, False, False)] * 9 * globals_, calls
    for row, seq in enumerate(seqs):
        alone = _decode(model, seq[None], len(seq) - 9)[0]
        torch.testing.assert_close(batched[row, 27 - len(seq):], alone, rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_decoding_keeps_the_callers_other_sdpa_backends(monkeypatch):
    """Decoding turns cuDNN off and nothing else on: under the caller's sdpa_kernel(MATH) its steps
    still see flash attention off."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from tapa.model import attention

    model = TapaLM(tiny_config(pe="rope")).eval()
    ids = torch.randint(0, VOCAB, (1, 12), generator=torch.Generator().manual_seed(5))
    flash, real = [], attention._softmax
    monkeypatch.setattr(attention, "_softmax", lambda *args, **kwargs: flash.append(
        torch.backends.cuda.flash_sdp_enabled()) or real(*args, **kwargs))
    with sdpa_kernel(SDPBackend.MATH):
        _decode(model, ids, 8)
    assert flash == [False] * 2 * 5 and torch.backends.cuda.flash_sdp_enabled()


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


def test_a_pattern_cut_before_its_global_layer_is_a_warning():
    """A pattern repeats from layer 0: "LLG" over 8 layers is LLGLLGLL, its last two layers local,
    which the toy study's screen once ran as "the LLG ratio" without a word."""
    import warnings

    with pytest.warns(UserWarning, match="layer_pattern 'LLG' repeats from layer 0 over n_layers=8: the layers "
                                         "are LLGLLGLL, the last ones local"):
        tiny_config(layer_pattern="LLG", n_layers=8, local_window=8)
    with warnings.catch_warnings():  # the pattern divides the layers, or is written out, or has no G
        warnings.simplefilter("error")
        tiny_config(layer_pattern="LLLG", n_layers=8, local_window=8)
        tiny_config(layer_pattern="LGLLGLLG", n_layers=8, local_window=8)
        tiny_config(layer_pattern="L", n_layers=3, local_window=8)


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
    from tapa.ops.tapa import decode as decode_op
    from tapa.ops.tapa import decode_kernel

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


@pytest.mark.parametrize("pe, pattern, head_dim", [("tapa", "LG", 24), ("nope", "LG", None), ("rope", "G", 8)])
def test_qkv_biases_and_qk_norm(pe, pattern, head_dim):
    """Converted Qwen2 / Qwen3 layouts: the q/k/v biases and the per-head QK-norm weights are
    parameters that learn, a KV cache gives the full forward's logits, a state dict of the layout
    before the phase split (biases too) loads exactly, and the norm makes q and k scale-free."""
    torch.manual_seed(6)
    model = TapaLM(tiny_config(pe=pe, n_layers=2, layer_pattern=pattern, local_window=5,
                               attention_bias=True, qk_norm=True, norm_eps=1e-12,  # ~scale-free norm
                               head_dim=head_dim))  # 4 heads of 24 or 8 at dim 64: other than dim / heads
    ids = torch.randint(0, VOCAB, (2, 23))
    with torch.no_grad():  # away from the init's zero biases and unit norms
        for name, param in model.named_parameters():
            if name.endswith(("bias", "_norm.weight")) and ".attn." in name:
                param.add_(0.3 * torch.randn_like(param))
    model.loss(ids[:, :-1], ids[:, 1:]).backward()
    extra = [(n, p) for n, p in model.named_parameters() if n.endswith(("bias", "q_norm.weight", "k_norm.weight"))]
    biases = 3 + (5 if pe == "tapa" else 3)  # q, k, v per layer; a TAPA layer's q and k in two parts each
    assert len(extra) == biases + 2 * 2  # and a q and a k norm per layer
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for _, p in extra)
    model.eval()
    with torch.no_grad():
        full = model(ids)
        torch.testing.assert_close(_decode(model, ids, 15), full, atol=2e-5, rtol=1e-4)
        attn = model.layers[-1].attn
        for linear in (attn.wq, attn.wk, attn.wq_phase, attn.wk_phase):  # q and k x 3, their biases too
            if linear is not None:
                linear.weight.mul_(3.0)
                linear.bias.mul_(3.0)
        torch.testing.assert_close(model(ids), full, atol=1e-5, rtol=1e-4)
        attn.wv.bias.add_(1.0)  # the check can fail: v has no norm
        assert not torch.allclose(model(ids), full, atol=1e-3)
        attn.wv.bias.sub_(1.0)
    if pe != "tapa":
        return
    old = {}
    for name, tensor in model.state_dict().items():
        if "_phase." in name:
            continue
        if name.endswith(("attn.wq.weight", "attn.wk.weight", "attn.wq.bias", "attn.wk.bias")) and \
                name.startswith("layers.1."):
            main, kind = name.split(".")[-2:]
            phase = getattr(attn, main + "_phase").state_dict()[kind]
            heads, rest = tensor.shape[0] // attn.amp_dim, tensor.shape[1:]  # rest: (dim,) or () for a bias
            whole = torch.cat([tensor.reshape(heads, attn.amp_dim, *rest), phase.reshape(heads, -1, *rest)], 1)
            tensor = whole.reshape(-1, *rest)
        old[name] = tensor.clone()
    loaded = TapaLM(model.config)
    loaded.load_state_dict(old)
    with torch.no_grad():
        torch.testing.assert_close(loaded.eval()(ids), model(ids), atol=0, rtol=0)
