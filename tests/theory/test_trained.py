"""Theory on trained weights (tapa.theory.trained) on tiny randomly initialized models: the captured
q/k and logits are the layer's own, and the binned moments are the plain per-bin mean/variance."""

import math

import numpy as np
import pytest
import torch

from tapa.model import ModelConfig, TapaLM
from tapa.ops.tapa.reference import tapa_logits
from tapa.positional.rope import apply_rope, rope_cos_sin, rope_frequencies
from tapa.theory import trained

LAYER = 1


def tiny_model(pe: str, **extra) -> TapaLM:
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=64, dim=32, n_layers=2, n_heads=2, pe=pe, phase_init_scale=0.5, **extra)
    return TapaLM(cfg).eval()


def manual_qkv(model, ids):
    """The layer's q, k, v (not rotated) by hand: embedding, the blocks before it, its attention
    norm, each head's amplitude then phase rows; and the attention input and context."""
    from tapa.model.attention import AttentionContext

    with torch.no_grad():
        ctx = AttentionContext.build(ids.shape[0], 0, ids.shape[1], ids.device, cfg=model.config)
        x = model.embed(ids)
        for block in model.layers[:LAYER]:
            x = block(x, ctx)
        x = model.layers[LAYER].attn_norm(x)
        attn = model.layers[LAYER].attn
        shape = (*ids.shape, model.config.n_heads, -1)
        q, k = attn.wq(x).view(shape), attn.wk(x).view(shape)
        if attn.wq_phase is not None:
            q = torch.cat([q, attn.wq_phase(x).view(shape)], -1)
            k = torch.cat([k, attn.wk_phase(x).view(shape)], -1)
        return q, k, attn.wv(x).view(shape), x, ctx


def rotate(x, cfg, method="rope"):
    """x (B, N, H, D) rotated at positions 0..N-1 by tapa.positional (independent of the model)."""
    inv_freq, factor = rope_frequencies(method, cfg.head_dim, base=cfg.rope_base, factor=cfg.rope_scale,
                                        original_seq_len=cfg.original_seq_len, seq_len=x.shape[1])
    return apply_rope(x, *rope_cos_sin(inv_freq, torch.arange(x.shape[1]), factor))


def attention_from_logits(logits, v, window=None):
    """softmax over causal keys (within `window`) of logits (B, H, N, N), times v (B, N, H, D)."""
    n = logits.shape[-1]
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    if window is not None:
        causal &= ~torch.ones(n, n, dtype=torch.bool).tril(-window)
    weights = torch.softmax(logits.masked_fill(~causal, float("-inf")), dim=-1)
    return torch.einsum("bhmn,bnhd->bmhd", weights, v)


@pytest.mark.parametrize("pe", ["tapa", "tapa-linear-phase"])
def test_tapa_logits_are_the_layers_own(pe):
    model = tiny_model(pe, phase_matrix="diagonal")
    with torch.no_grad():
        model.layers[LAYER].attn.phase_matrix.uniform_(0.5, 1.5)  # not the identity
    ids = torch.randint(0, 64, (2, 40), generator=torch.Generator().manual_seed(1))
    q, k = trained.capture_qk(model, LAYER, ids)
    q_ref, k_ref, v_ref, x, ctx = manual_qkv(model, ids)
    torch.testing.assert_close(q, q_ref)
    torch.testing.assert_close(k, k_ref)
    logits = trained.layer_logits(model, LAYER, q, k)
    attn = model.layers[LAYER].attn
    pos = torch.arange(40)
    direct = tapa_logits(attn._apply_phase_matrix(q_ref).transpose(1, 2), k_ref.transpose(1, 2), pos, pos,
                         amp_dim=attn.amp_dim, alpha=model.config.alpha, distance="power",
                         phase=model.config.phase)
    torch.testing.assert_close(logits, direct)
    # and the attention these logits give is the layer's attention output (before w_o)
    with torch.no_grad():
        layer_out = attn(x, ctx)
        ours = attn.wo(attention_from_logits(logits, v_ref).reshape(2, 40, -1))
    torch.testing.assert_close(ours, layer_out, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("pe", ["rope", "rope-yarn", "nope"])
def test_rope_and_nope_logits_reproduce_the_layer(pe):
    model = tiny_model(pe, rope_scale=2.0, original_seq_len=16)
    ids = torch.randint(0, 64, (2, 33), generator=torch.Generator().manual_seed(2))
    q, k = trained.capture_qk(model, LAYER, ids)
    _, _, v, x, ctx = manual_qkv(model, ids)
    logits = trained.layer_logits(model, LAYER, q, k)
    if pe != "nope":
        method = model.config.rope_method
        q, k = rotate(q, model.config, method), rotate(k, model.config, method)
    torch.testing.assert_close(logits, torch.einsum("bmhd,bnhd->bhmn", q, k) / math.sqrt(16))
    attn = model.layers[LAYER].attn
    with torch.no_grad():
        layer_out = attn(x, ctx)
        ours = attn.wo(attention_from_logits(logits, v).reshape(2, 33, -1))
    torch.testing.assert_close(ours, layer_out, atol=1e-5, rtol=1e-4)


def test_local_layer_of_a_hybrid_is_windowed_rope():
    model = tiny_model("tapa", layer_pattern="GL", local_window=5)  # layer 1 is local
    ids = torch.randint(0, 64, (2, 30), generator=torch.Generator().manual_seed(5))
    assert trained.layer_kind(model, LAYER) == ("local-rope", 5)
    assert trained.layer_kind(model, 0) == ("tapa", None)
    q, k = trained.capture_qk(model, LAYER, ids)
    _, _, v, x, ctx = manual_qkv(model, ids)
    logits = trained.layer_logits(model, LAYER, q, k)
    torch.testing.assert_close(logits, torch.einsum("bmhd,bnhd->bhmn", rotate(q, model.config),
                                                    rotate(k, model.config)) / math.sqrt(16))
    attn = model.layers[LAYER].attn
    with torch.no_grad():
        layer_out = attn(x, ctx)
        ours = attn.wo(attention_from_logits(logits, v, window=5).reshape(2, 30, -1))
    torch.testing.assert_close(ours, layer_out, atol=1e-5, rtol=1e-4)
    edges = trained.distance_bins(30, per_decade=4)
    sums = trained.binned_logit_moments(model, LAYER, q, k, edges)
    reach = edges[1:] > 5  # bins that start at or past the window hold no pairs
    assert (sums["count"][:, edges[:-1] >= 5] == 0).all() and sums["count"][:, ~reach].all()


def test_binned_moments_match_a_direct_count():
    model = tiny_model("tapa")
    ids = torch.randint(0, 64, (3, 37), generator=torch.Generator().manual_seed(3))
    q, k = trained.capture_qk(model, LAYER, ids)
    edges = trained.distance_bins(37, per_decade=4)
    assert edges[0] == 0 and edges[1] == 1 and edges[-1] == 37
    sums = trained.binned_logit_moments(model, LAYER, q, k, edges, block=5)  # ragged query blocks
    logits = trained.layer_logits(model, LAYER, q, k).double().numpy()  # (B, H, N, N)
    m, n = np.meshgrid(np.arange(37), np.arange(37), indexing="ij")
    causal = m >= n
    row_mean = np.where(causal, logits, 0).sum(-1, keepdims=True) / causal.sum(-1, keepdims=True)
    for b in range(len(edges) - 1):
        in_bin = causal & (m - n >= edges[b]) & (m - n < edges[b + 1])
        for head in range(2):
            values = logits[:, head][:, in_bin]
            centered = (logits - row_mean)[:, head][:, in_bin]
            assert sums["count"][head, b] == values.size
            np.testing.assert_allclose(sums["x"][head, b], values.sum(), rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(sums["x2"][head, b], (values**2).sum(), rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(sums["c"][head, b], centered.sum(), rtol=1e-4, atol=1e-5)
    rows = trained._rows_from_sums(sums, edges, run="r", label="tapa", layer=LAYER, kind="tapa")
    first = next(r for r in rows if r["head"] == "all" and r["estimate"] == "trained" and r["bin_start"] == 1)
    values = logits[:, :, (m - n == 1)].reshape(-1)  # the bin [1, 2) holds distance 1 only
    assert first["bin_end"] == 2 and first["distance"] == 1
    np.testing.assert_allclose([first["mean"], first["var"]], [values.mean(), values.var(ddof=1)], rtol=1e-5)


def test_analyse_writes_csv_and_plot(tmp_path):
    rows = []
    ids = torch.randint(0, 64, (2, 48), generator=torch.Generator().manual_seed(4))
    for pe in ("tapa", "rope", "nope"):
        rows += trained.analyse(tiny_model(pe), LAYER, ids, run=pe, iid_samples=500, per_decade=4)
    estimates = {(r["run"], r["estimate"]) for r in rows}
    assert ("tapa", "iid-gaussian") in estimates and ("rope", "iid-gaussian") in estimates
    assert ("nope", "iid-gaussian") not in estimates and ("nope", "iid-empirical") in estimates
    # NoPE's logit does not depend on distance: its iid means agree within their standard errors
    nope_iid = [r for r in rows if r["run"] == "nope" and r["estimate"] == "iid-empirical"]
    first = nope_iid[0]
    for row in nope_iid[1:]:
        assert abs(row["mean"] - first["mean"]) < 6 * math.hypot(row["mean_se"], first["mean_se"])
    trained.write_csv(rows, tmp_path / "t.csv")
    trained.plot(rows, tmp_path / "t.png")
    assert (tmp_path / "t.png").stat().st_size > 0
    assert (tmp_path / "t.csv").read_text().startswith("run,label,layer,kind,estimate")
    with pytest.raises(ValueError, match="layer"):
        trained.analyse(tiny_model("tapa"), 5, ids)
