"""The varlen kernels under each row of the config table (`tapa.ops.tapa.configs`), and the
backward's padded lse and delta (`tapa.ops.tapa.kernels`' module docstring).

Each row's tiles and code paths (the D=128 row's dQ by atomics among them) on packed sequences
against the float64 spec, with a sequence longer than SEQUENCE_ALIGN rows and sequences that start
off a multiple of it; the padded layout itself; a query tile longer than the padding refused. On CPU
under Triton's interpreter (conftest.py), in float32: the interpreter's bfloat16 dot is not
trustworthy, and float32 shows any misplaced row at once."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

pytest.importorskip("triton")

from tapa.ops.tapa import configs as table, kernels, launch  # noqa: E402
from tapa.ops.tapa.configs import KernelConfigs, Tile  # noqa: E402
from tapa.ops.tapa.reference import split_dims  # noqa: E402
from tapa.ops.tapa.varlen import naive_tapa_attention_varlen  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
ROWS = {name: row for name, row in vars(table).items() if isinstance(row, KernelConfigs)}
ALIGN = kernels.SEQUENCE_ALIGN.value
# (Lq, Lk): past one padding block, one-token-ish, empty, Lq < Lk; the later ones start off a
# multiple of ALIGN
LENGTHS = [(ALIGN + 3, ALIGN + 3), (6, 6), (0, 0), (40, 70)]


def _offsets(lengths) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32,
                        device=DEVICE)


def _row_head_dim(name: str) -> int:
    """The smallest head dim of the row's CUDA keys (the interpreter's row: the smallest class)."""
    keys = [key for key, row in table.TABLE.items() if row is ROWS[name]]
    return min(width for arch, _, width in keys if arch == "cuda" or name == "INTERPRETER")


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("name", ROWS)
def test_row_varlen_matches_float64(name, causal):
    """out, lse and every gradient (with one on lse too) of each row's varlen kernels against the
    float64 spec, at float32 accuracy."""
    head_dim = _row_head_dim(name)
    gen = torch.Generator().manual_seed(len(name) + head_dim)
    total_q, total_k = (sum(pair[i] for pair in LENGTHS) for i in (0, 1))
    q = torch.randn(total_q, 2, head_dim, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(total_k, 1, head_dim, generator=gen, dtype=torch.float64) for _ in range(2))
    q, k, v = (t.to(DEVICE) for t in (q, k, v))
    cu_q, cu_k = _offsets([a for a, _ in LENGTHS]), _offsets([b for _, b in LENGTHS])
    varlen = launch.Varlen(cu_q, cu_k, max(a for a, _ in LENGTHS), max(b for _, b in LENGTHS))
    args = dict(amp_dim=split_dims(head_dim, 0.5)[0], alpha=0.3, distance="power",
                phase="quadratic", causal=causal, q_offset=0, k_offset=0, configs=ROWS[name],
                varlen=varlen)
    out, lse = launch.forward(q.float(), k.float(), v.float(), **args)
    d_out = torch.randn(out.shape, generator=gen).to(DEVICE)
    d_lse = torch.where(torch.isinf(lse), 0.0, torch.randn(lse.shape, generator=gen).to(DEVICE))
    grads = launch.backward(d_out, d_lse, q.float(), k.float(), v.float(), out, lse, **args)

    exact_inputs = [t.clone().requires_grad_() for t in (q, k, v)]
    exact_out, exact_lse = naive_tapa_attention_varlen(*exact_inputs, cu_q, cu_k, causal=causal,
                                                       alpha=0.3, return_lse=True)
    seen = torch.isfinite(exact_lse)
    ((exact_out * d_out.double()).sum()
     + (torch.where(seen, exact_lse, 0.0) * d_lse.double()).sum()).backward()
    assert torch.equal(torch.isfinite(lse), seen)
    pairs = [(out, exact_out), (lse[seen], exact_lse[seen])]
    pairs = [(got, want.detach()) for got, want in pairs]
    pairs += [(got, want.grad) for got, want in zip(grads, exact_inputs)]
    for got, want in pairs:
        assert float((got.double() - want).norm() / want.norm()) < 2e-5, (got, want)


def test_padded_lse_and_delta_layout():
    """Sequence b's rows sit from ALIGN x (q_start // ALIGN + b) of each head's padded row, up to
    the next multiple of ALIGN: lse copied, delta = rowsum(out * dout) - dlse, and lse +inf and
    delta 0 past the sequence's end."""
    lengths = [3, 0, ALIGN + 9, 1]
    heads, v_dim = 2, 8
    gen = torch.Generator().manual_seed(3)
    total = sum(lengths)
    out, dout = (torch.randn(1, total, heads, v_dim, generator=gen).to(DEVICE) for _ in range(2))
    lse, dlse = (torch.randn(1, heads, total, generator=gen).to(DEVICE) for _ in range(2))
    cu_q = _offsets(lengths)
    varlen = launch.Varlen(cu_q, cu_q, max(lengths), max(lengths))
    padded_lse, delta, n_padded = launch._padded_row_terms(out, dout, dlse, lse, varlen,
                                                           table.INTERPRETER)
    assert padded_lse.shape == delta.shape == (heads, n_padded) and n_padded % ALIGN == 0
    want_delta = (out * dout).sum(-1)[0].T - dlse[0]
    for b, length in enumerate(lengths):
        start = int(cu_q[b])
        first = ALIGN * (start // ALIGN + b)
        end = first + -(-length // ALIGN) * ALIGN
        assert end <= n_padded
        rows = slice(first, first + length)
        assert torch.equal(padded_lse[:, rows], lse[0, :, start:start + length])
        assert torch.allclose(delta[:, rows], want_delta[:, start:start + length], atol=1e-5)
        assert torch.all(padded_lse[:, first + length:end] == float("inf"))
        assert torch.all(delta[:, first + length:end] == 0)


def test_varlen_refuses_a_query_tile_longer_than_the_padding():
    wide = replace(ROWS["INTERPRETER"], dq=Tile(2 * ALIGN, 16, 4, 2))
    q = torch.randn(5, 2, 16, device=DEVICE)
    cu = _offsets([5])
    with pytest.raises(ValueError, match="block_m"):
        launch.backward(q, None, q, q, q, q, torch.zeros(2, 5, device=DEVICE), amp_dim=8,
                        alpha=0.1, distance="power", phase="quadratic", causal=True, q_offset=0,
                        k_offset=0, configs=wide, varlen=launch.Varlen(cu, cu, 5, 5))
