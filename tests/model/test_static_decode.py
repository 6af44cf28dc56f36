"""StaticDecoder / TapaLM.generate: the static-shape decoding step (full cache buffers, positions on
the device, for CUDA graphs) gives the eager step's logits, for every layer kind, GQA, a local ring
that wraps, RoPE scaling, and converted Qwen layouts (biases, QK-norm, heads wider than dim /
heads); on CUDA the captured graph's tokens equal the eager loop's."""

import importlib.util

import pytest
import torch

from tapa.model import ModelConfig, StaticDecoder, TapaLM

CONFIGS = {
    "tapa": dict(pe="tapa", phase_matrix="diagonal"),
    "tapa-linear-gqa": dict(pe="tapa-linear-phase", n_kv_heads=1),
    "rope-yarn": dict(pe="rope-yarn", rope_scale=4.0, original_seq_len=16),
    "nope": dict(pe="nope"),
    "hybrid-tapa": dict(pe="tapa", layer_pattern="LLLG", local_window=8),
    "hybrid-rope-gqa": dict(pe="rope", layer_pattern="LG", local_window=5, n_kv_heads=1),
    "hybrid-tapa-qwen-layout": dict(pe="tapa", layer_pattern="LLLG", local_window=8, attention_bias=True,
                                    qk_norm=True, head_dim=24),  # 2 heads of 24 at dim 32
}
KERNEL_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # where impl="triton" runs


def _eager_greedy(model: TapaLM, prompt: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """The eager loop `generate` must match: prefill, then forward with the KVCache per token."""
    cache = model.new_kv_cache(prompt.shape[0], prompt.shape[1] + new_tokens)
    tokens = [model(prompt, 0, cache)[:, -1:].argmax(-1)]
    for _ in range(new_tokens - 1):
        tokens.append(model(tokens[-1], cache.length, cache)[:, -1:].argmax(-1))
    return torch.cat(tokens, dim=1)


def _model(name: str, dtype=torch.float64, device="cpu") -> TapaLM:
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=61, dim=32, n_layers=4, n_heads=2, ffn_dim=48, phase_init_scale=1.0,
                      **CONFIGS[name])
    return TapaLM(cfg).to(device=device, dtype=dtype).eval()


@pytest.mark.parametrize("name", sorted(CONFIGS))
@torch.no_grad()
def test_static_steps_give_the_eager_logits(name):
    """Teacher-forced: 17 steps after a 6-token prompt (the rings of 5 and 8 slots wrap), batch 3."""
    model = _model(name)
    tokens = torch.randint(0, 61, (3, 6 + 17), generator=torch.Generator().manual_seed(1))
    eager_cache, static_cache = model.new_kv_cache(3, 24), model.new_kv_cache(3, 24)
    model(tokens[:, :6], 0, eager_cache)
    model(tokens[:, :6], 0, static_cache)
    decoder = StaticDecoder(model, static_cache)
    worst = 0.0
    for step in range(6, 23):
        eager = model(tokens[:, step:step + 1], step, eager_cache)
        static = decoder(tokens[:, step:step + 1])
        assert static.shape == eager.shape == (3, 1, 61)
        worst = max(worst, ((static - eager).norm() / eager.norm()).item())
    assert worst < 1e-10, worst
    assert static_cache.length == eager_cache.length == 23
    for mine, theirs in zip(static_cache.keys, eager_cache.keys):  # the same slots were written
        torch.testing.assert_close(mine, theirs, rtol=0, atol=1e-12)


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")
@torch.no_grad()
def test_the_decode_kernel_path_on_full_buffers():
    """attn_impl="triton": the global TAPA layers run the split-KV decode kernel (on CUDA where
    there is one, else the interpreter, which conftest.py turns on) on the cache's full
    buffers with lengths pos + 1, and agree with the eager step, which runs the same kernel on the
    filled slots only (float32)."""
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=61, dim=32, n_layers=2, n_heads=2, ffn_dim=48, phase_init_scale=1.0,
                      pe="tapa", layer_pattern="LG", local_window=4, attn_impl="triton")
    model = TapaLM(cfg).to(KERNEL_DEVICE).eval()
    tokens = torch.randint(0, 61, (2, 9), generator=torch.Generator().manual_seed(4)).to(KERNEL_DEVICE)
    eager_cache, static_cache = model.new_kv_cache(2, 40), model.new_kv_cache(2, 40)
    model(tokens[:, :4], 0, eager_cache)
    model(tokens[:, :4], 0, static_cache)
    decoder = StaticDecoder(model, static_cache)
    for step in range(4, 9):
        eager = model(tokens[:, step:step + 1], step, eager_cache)
        static = decoder(tokens[:, step:step + 1])
        assert ((static - eager).norm() / eager.norm()).item() < 1e-5


@torch.no_grad()
def test_generate_matches_an_eager_greedy_loop():
    model = _model("hybrid-tapa")
    prompt = torch.randint(0, 61, (2, 5), generator=torch.Generator().manual_seed(2))
    expected = _eager_greedy(model, prompt, 12)
    out = model.generate(prompt, 12)
    assert torch.equal(out, expected) and out.shape == (2, 12)
    assert torch.equal(model.generate(prompt, 1), expected[:, :1])


@torch.no_grad()
def test_prefill_keeps_the_last_logits_only():
    """logits_to_keep=k gives the last k positions' logits of the full forward; generate and the
    retrieval evaluations' greedy loop never project the whole prompt onto the vocabulary."""
    from tapa.eval import greedy_generate

    model = _model("hybrid-tapa")
    prompt = torch.randint(0, 61, (2, 9), generator=torch.Generator().manual_seed(4))
    full = model(prompt)
    for keep in (1, 3, 9):
        kept = model(prompt, logits_to_keep=keep)
        assert kept.shape == (2, keep, 61)
        torch.testing.assert_close(kept, full[:, -keep:], rtol=1e-12, atol=1e-12)  # float64
    rows = []
    hook = model.lm_head.register_forward_hook(lambda module, args, out: rows.append(args[0].shape[1]))
    try:
        out = model.generate(prompt, 4)
        assert torch.equal(greedy_generate(model, prompt, 4), out)
    finally:
        hook.remove()
    assert rows == [1] * 8, rows  # prefill and each step: one position a row
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="logits_to_keep"):
            model(prompt, logits_to_keep=bad)
    with pytest.raises(ValueError, match="logits_to_keep"):
        model(prompt, targets=prompt, logits_to_keep=1)


@torch.no_grad()
def test_sampling():
    """temperature > 0 samples (reproducibly with a generator); top_k=1 is greedy at any temperature;
    a top_k sample only ever takes one of the k most likely tokens of the eager model."""
    model = _model("hybrid-tapa")
    prompt = torch.randint(0, 61, (3, 5), generator=torch.Generator().manual_seed(5))
    greedy = model.generate(prompt, 10)
    assert torch.equal(model.generate(prompt, 10, temperature=2.0, top_k=1), greedy)
    draws = [model.generate(prompt, 10, temperature=5.0, generator=torch.Generator().manual_seed(s))
             for s in (7, 7, 8)]
    assert torch.equal(draws[0], draws[1]) and not torch.equal(draws[0], draws[2])
    assert not torch.equal(draws[0], greedy)
    sample = model.generate(prompt, 8, temperature=5.0, top_k=3, generator=torch.Generator().manual_seed(9))
    cache = model.new_kv_cache(3, 13)
    logits = model(prompt, 0, cache)
    for step in range(8):
        top = logits[:, -1].topk(3, dim=-1).indices
        assert (top == sample[:, step:step + 1]).any(-1).all(), step
        logits = model(sample[:, step:step + 1], cache.length, cache)
    for bad in (dict(temperature=-1.0), dict(temperature=float("nan")), dict(top_k=0), dict(top_k=2.5)):
        with pytest.raises(ValueError, match="temperature|top_k"):
            model.generate(prompt, 2, **bad)


@torch.no_grad()
def test_what_static_decoding_refuses():
    model = _model("tapa")
    cache = model.new_kv_cache(2, 8)
    with pytest.raises(ValueError, match="prefill first"):
        StaticDecoder(model, cache)
    model(torch.zeros(2, 7, dtype=torch.long), 0, cache)
    with pytest.raises(ValueError, match="cuda_graph=True needs"):
        StaticDecoder(model, cache, cuda_graph=True)
    decoder = StaticDecoder(model, cache)
    with pytest.raises(ValueError, match=r"tokens must be \(batch, 1\)"):
        decoder(torch.zeros(2, 2, dtype=torch.long))
    decoder(torch.zeros(2, 1, dtype=torch.long))
    with pytest.raises(ValueError, match="the cache is full"):
        decoder(torch.zeros(2, 1, dtype=torch.long))
    cache = model.new_kv_cache(2, 8)
    model(torch.zeros(2, 3, dtype=torch.long), 0, cache)
    decoder = StaticDecoder(model, cache)
    model(torch.zeros(2, 1, dtype=torch.long), 3, cache)  # an eager step: the decoder's position is stale
    with pytest.raises(ValueError, match="advanced outside the decoder"):
        decoder(torch.zeros(2, 1, dtype=torch.long))
    with pytest.raises(TypeError, match="KVCache"):
        StaticDecoder(model, object())
    dynamic = TapaLM(ModelConfig(vocab_size=61, dim=32, n_layers=2, n_heads=2, pe="rope-dynamic-ntk"))
    cache = dynamic.new_kv_cache(1, 8)
    dynamic(torch.zeros(1, 3, dtype=torch.long), 0, cache)
    with pytest.raises(ValueError, match="dynamic-NTK"):
        StaticDecoder(dynamic, cache)
    for bad in (0, 2.0, True):
        with pytest.raises(ValueError, match="max_new_tokens"):
            model.generate(torch.zeros(1, 3, dtype=torch.long), bad)
    with pytest.raises(ValueError, match="cuda_graph=True needs"):  # even with nothing to decode
        model.generate(torch.zeros(1, 3, dtype=torch.long), 1, cuda_graph=True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("name", ["tapa", "hybrid-tapa", "rope-yarn"])
@torch.no_grad()
def test_cuda_graph_replays_give_the_eager_tokens(name):
    """bf16 on the GPU: the captured step's tokens equal the uncaptured static step's (the same
    kernels, replayed), and its logits stay within bf16 noise of the eager model's."""
    model = _model(name, dtype=torch.bfloat16, device="cuda")
    prompt = torch.randint(0, 61, (4, 40), device="cuda", generator=torch.Generator("cuda").manual_seed(3))
    graph = model.generate(prompt, 30, cuda_graph=True)
    plain = model.generate(prompt, 30, cuda_graph=False)
    assert torch.equal(graph, plain)
    eager_cache, static_cache = model.new_kv_cache(4, 80), model.new_kv_cache(4, 80)
    model(prompt, 0, eager_cache)
    model(prompt, 0, static_cache)
    decoder = StaticDecoder(model, static_cache, cuda_graph=True)
    for step in range(20):
        token = plain[:, step:step + 1]
        eager = model(token, eager_cache.length, eager_cache).float()
        replay = decoder(token).float()
        assert ((replay - eager).norm() / eager.norm()).item() < 2e-2


def test_steps_run_without_autograd_in_grad_mode():
    """Called with autograd on (outside no_grad), a step builds no graph: its logits and the cache
    need no grad, so TAPA layers keep the decode kernel (a graph could not capture the fallback)
    and the cache does not grow a graph step by step."""
    model = _model("hybrid-tapa")
    prompt = torch.randint(0, 61, (2, 5), generator=torch.Generator().manual_seed(5))
    eager_cache, static_cache = model.new_kv_cache(2, 9), model.new_kv_cache(2, 9)
    with torch.no_grad():
        model(prompt, 0, eager_cache)
        model(prompt, 0, static_cache)
        expected = model(prompt[:, -1:], 5, eager_cache)
    decoder = StaticDecoder(model, static_cache)
    logits = decoder(prompt[:, -1:])
    assert not logits.requires_grad and not any(keys.requires_grad for keys in static_cache.keys)
    torch.testing.assert_close(logits, expected, rtol=0, atol=1e-12)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_a_step_no_graph_can_capture_is_refused():
    """float64 on the GPU: the decode kernel takes no float64, so the TAPA layers' fallback reads
    the lengths on the host. cuda_graph=True is refused with the reason, generate's default
    decodes without a graph (the eager loop's tokens), and a bf16 model captures in grad mode."""
    model = _model("tapa", device="cuda")
    prompt = torch.randint(0, 61, (2, 5), device="cuda", generator=torch.Generator("cuda").manual_seed(6))
    with torch.no_grad():
        expected = _eager_greedy(model, prompt, 6)
        cache = model.new_kv_cache(2, 12)
        model(prompt, 0, cache)
        with pytest.raises(ValueError, match="cuda_graph=True needs the split-KV decode kernel.*float64"):
            StaticDecoder(model, cache, cuda_graph=True)
    assert torch.equal(model.generate(prompt, 6), expected)
    model = _model("tapa", dtype=torch.bfloat16, device="cuda")
    with torch.no_grad():
        cache = model.new_kv_cache(2, 12)
        model(prompt, 0, cache)
    decoder = StaticDecoder(model, cache, cuda_graph=True)
    for _ in range(3):  # autograd on: the step still captures and replays
        assert decoder(prompt[:, -1:]).isfinite().all()
