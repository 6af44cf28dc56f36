"""`tapa bench varlen`: its packing and offsets (the timing itself needs a GPU)."""

import importlib.util

import pytest
import torch

from tapa.bench.varlen import cu_seqlens, pack_documents


def test_pack_documents_fills_rows_in_order_and_cuts_the_last():
    rows = pack_documents([5, 3, 9, 2], row_len=8, rows=3)
    assert rows == [[5, 3], [8], [2, 5, 1]]
    assert all(sum(row) == 8 for row in rows)


def test_cu_seqlens_are_int32_offsets():
    cu = cu_seqlens([5, 3, 0, 2], device="cpu")
    assert cu.dtype == torch.int32 and cu.tolist() == [0, 5, 8, 8, 10]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU message")
def test_needs_a_gpu(capsys):
    from tapa.cli import main

    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        main(["bench", "varlen", "--out", "unused"])


def test_torch_varlen_anchor_is_torchs_causal_varlen_attention_where_it_exists(monkeypatch):
    """The anchor is None without torch.nn.attention.varlen; where it exists (torch 2.10+) the
    bench calls it causal ((-1, 0) window) on the pack's offsets."""
    from tapa.bench import varlen

    if importlib.util.find_spec("torch.nn.attention.varlen") is None:
        assert varlen._sdpa_varlen_fn(cu_seqlens([3, 5], device="cpu"), 5) is None
        return
    calls = []
    module = importlib.import_module("torch.nn.attention.varlen")
    monkeypatch.setattr(module, "varlen_attn", lambda *args, **kwargs: calls.append((args, kwargs)) or "out")
    fn = varlen._sdpa_varlen_fn(cu_seqlens([3, 5], device="cpu"), 5)
    assert fn("q", "k", "v") == "out"
    (args, kwargs), = calls
    assert args[3].tolist() == [0, 3, 8] and args[5:] == (5, 5) and kwargs == {"window_size": (-1, 0)}
