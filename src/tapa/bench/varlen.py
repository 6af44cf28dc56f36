"""`tapa bench varlen` (also `tapa bench attention --varlen`): the packed-document (varlen) TAPA
kernel against the dense kernel and against plain attention with the same mask, on one GPU.

Three tables, bf16, causal, H heads, fwd+bwd times as triton.testing.do_bench medians:
- equal documents: T tokens cut into documents of L tokens; varlen against the dense kernel at
  batch T / L and length L (the same work; the target is at most 1.05x);
- packed corpus: document lengths from the built-in corpus (its own tokenizer), packed in order
  into rows of R tokens (a document that does not fit is cut at the row's end, as training packs
  them); varlen time against the dense kernel's time for the FLOPs the mask keeps (the dense
  kernel's causal FLOP rate at length R, measured in the same run; target at most 1.2x), and
  against FlexAttention's document-masked causal attention on the same pack (target 1.25x), and
  against torch's own varlen attention (`torch.nn.attention.varlen.varlen_attn`, FlashAttention's
  varlen kernel) where this torch has it;
- accuracy: the varlen kernel's bf16 error against float64 over its same-dtype reference's
  (outputs and every gradient; target at most 1.5).
FLOPs of one causal document of L tokens: 4 * H * L^2 * D / 2 forward, 2.5x that backward.
Writes varlen.csv and varlen.md (with the command, date and GPU) to --out.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import sys
from pathlib import Path

import torch

from tapa._paths import write_csv

FLOP_FACTOR = 3.5  # fwd + bwd over the forward's FLOPs


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--head-dims", type=int, nargs="+", default=[128, 64])
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=65536,
                        help="tokens of the equal-documents case (batch x N of the dense kernel)")
    parser.add_argument("--doc-lens", type=int, nargs="+", default=[1024, 4096, 16384],
                        help="document lengths of the equal-documents case")
    parser.add_argument("--row-lens", type=int, nargs="+", default=[8192, 32768, 131072],
                        help="row lengths the corpus' documents are packed into")
    parser.add_argument("--pack-tokens", type=int, default=131072,
                        help="tokens of each packed-corpus case (rows x row length)")
    parser.add_argument("--corpus-bytes", type=int, default=8_000_000,
                        help="bytes of the built-in corpus whose document lengths are drawn")
    parser.add_argument("--vocab-size", type=int, default=8192,
                        help="the corpus tokenizer's size (trained locally, cached)")
    parser.add_argument("--cache-dir", default=None, help="data cache (default: the project's)")
    parser.add_argument("--no-flex", action="store_true", help="skip FlexAttention")
    parser.add_argument("--check-tokens", type=int, default=4096,
                        help="tokens of the bf16 accuracy check (ragged documents)")
    parser.add_argument("--out", default="runs/bench/varlen", help="output directory")


def _random(shape, seed, dtype=torch.bfloat16, device="cuda"):
    gen = torch.Generator(device=device).manual_seed(seed)
    return torch.randn(shape, generator=gen, device=device, dtype=dtype)


def cu_seqlens(lengths, device="cuda") -> torch.Tensor:
    """int32 offsets (B + 1,) of these lengths."""
    offsets = torch.zeros(len(lengths) + 1, dtype=torch.int64)
    offsets[1:] = torch.tensor(lengths, dtype=torch.int64).cumsum(0)
    return offsets.to(device=device, dtype=torch.int32)


def pack_documents(doc_lengths, row_len: int, rows: int) -> list[list[int]]:
    """The documents' lengths in order, packed into `rows` rows of row_len tokens: each row takes
    whole documents while they fit and cuts the one that does not (its rest is dropped, as the
    training loader's windows cut documents), cycling through the list when it runs out."""
    packed, index = [], 0
    for _ in range(rows):
        row, left = [], row_len
        while left:
            take = min(int(doc_lengths[index % len(doc_lengths)]), left)
            row.append(take)
            left -= take
            index += 1
        packed.append(row)
    return packed


def corpus_document_lengths(corpus_bytes: int, vocab_size: int, cache_dir=None) -> list[int]:
    """Token counts of the built-in corpus' training documents (end-of-text separated)."""
    import numpy as np

    from tapa.data import DataConfig
    from tapa.data.cache import build_corpus

    values = dict(source="builtin", vocab_size=vocab_size, max_train_bytes=corpus_bytes)
    if cache_dir:
        values["cache_dir"] = cache_dir
    corpus = build_corpus(DataConfig(**values), progress=sys.stderr.isatty())
    tokens = np.asarray(corpus.tokens("train"))
    ends = np.flatnonzero(tokens == corpus.eot_id)
    lengths = np.diff(np.concatenate([[-1], ends]))
    return [int(n) for n in lengths if n > 0]


def _fwd_ms(fn, tensors):
    from triton.testing import do_bench

    with torch.no_grad():
        return do_bench(lambda: fn(*tensors), return_mode="median")


def _fwd_bwd_ms(fn, tensors, dout):
    from triton.testing import do_bench

    ms = do_bench(lambda: fn(*tensors).backward(dout), grad_to_none=list(tensors),
                  return_mode="median")
    for t in tensors:
        t.grad = None
    return ms


def _varlen_fn(cu, longest, causal=True):
    from tapa import tapa_attention_varlen

    def run(q, k, v):
        return tapa_attention_varlen(q, k, v, cu, cu, longest, longest, causal=causal,
                                     impl="triton", check_seqlens=False)
    return run


def _dense_fn(q, k, v):
    from tapa import tapa_attention

    return tapa_attention(q, k, v, causal=True, impl="triton")


def _flex_fn(lengths, total, heads, device):
    """FlexAttention causal attention masked to the documents of a (1, total) pack, compiled."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    doc = torch.repeat_interleave(torch.arange(len(lengths), device=device),
                                  torch.tensor(lengths, device=device))

    def document_causal(b, h, q_idx, kv_idx):
        return (doc[q_idx] == doc[kv_idx]) & (kv_idx <= q_idx)

    # _compile: the block table from the mask's compiled evaluation, never a (total, total) grid
    mask = create_block_mask(document_causal, None, None, total, total, device=device, _compile=True)
    compiled = torch.compile(flex_attention, dynamic=False)

    def run(q, k, v):  # (total, H, D) -> (1, H, total, D) and back
        out = compiled(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                       block_mask=mask)
        return out[0].transpose(0, 1)
    return run


def _sdpa_varlen_fn(cu, longest):
    """torch's varlen attention (causal), or None where this torch has none."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None

    def run(q, k, v):
        return varlen_attn(q, k, v, cu, cu, longest, longest, window_size=(-1, 0))
    return run


def _kept_flops(lengths, heads, head_dim) -> float:
    return sum(4 * heads * n * n * head_dim / 2 for n in lengths)


def equal_documents(head_dim, heads, tokens, doc_len):
    """(varlen ms, dense ms) fwd+bwd, then the same for the forward alone, for tokens / doc_len
    documents of doc_len tokens."""
    batch = tokens // doc_len
    q, k, v, dout = (_random((batch, doc_len, heads, head_dim), seed) for seed in range(4))
    for t in (q, k, v):
        t.requires_grad_(True)
    dense = _fwd_bwd_ms(_dense_fn, (q, k, v), dout)
    flat = [t.detach().reshape(batch * doc_len, heads, head_dim).requires_grad_() for t in (q, k, v)]
    cu = cu_seqlens([doc_len] * batch)
    varlen = _fwd_bwd_ms(_varlen_fn(cu, doc_len), flat, dout.reshape(batch * doc_len, heads, -1))
    return varlen, dense, _fwd_ms(_varlen_fn(cu, doc_len), flat), _fwd_ms(_dense_fn, (q, k, v))


def packed_corpus(head_dim, heads, rows, flex=True):
    """{impl: ms} fwd+bwd for one pack (a list of rows of document lengths), the dense kernel at
    the row length, and the kept FLOPs."""
    row_len = sum(rows[0])
    lengths = [n for row in rows for n in row]
    total = sum(lengths)
    q, k, v, dout = (_random((total, heads, head_dim), seed) for seed in range(4))
    for t in (q, k, v):
        t.requires_grad_(True)
    times = {"varlen": _fwd_bwd_ms(_varlen_fn(cu_seqlens(lengths), max(lengths)), (q, k, v), dout)}
    dense = [t.detach().view(len(rows), row_len, heads, head_dim).requires_grad_() for t in (q, k, v)]
    times["dense_row"] = _fwd_bwd_ms(_dense_fn, dense, dout.view(len(rows), row_len, heads, -1))
    anchors = {"sdpa_varlen": lambda: _sdpa_varlen_fn(cu_seqlens(lengths), max(lengths))}
    if flex:
        anchors["flex"] = lambda: _flex_fn(lengths, total, heads, q.device)
    for name, make in anchors.items():
        try:
            fn = make()
            if fn is not None:
                times[name] = _fwd_bwd_ms(fn, (q, k, v), dout)
        except Exception as err:  # noqa: BLE001  (an anchor missing or failing: say so)
            print(f"  {name}: {str(err).splitlines()[0] if str(err) else type(err).__name__}",
                  file=sys.stderr)
    dense_flops = len(rows) * 4 * heads * row_len * row_len * head_dim / 2
    kept = _kept_flops(lengths, heads, head_dim)
    return times, kept, dense_flops, lengths


def accuracy(head_dim, heads, tokens, seed=0):
    """bf16 errors vs float64 of the varlen kernel and of the same-dtype reference (ragged
    documents, GQA 2:1): {tensor: (kernel, reference)}."""
    from tapa import tapa_attention_varlen
    from tapa.ops.tapa.varlen import naive_tapa_attention_varlen

    gen = torch.Generator().manual_seed(seed)
    lengths, left = [], tokens
    while left:
        n = min(left, int(torch.randint(1, tokens // 4, (1,), generator=gen)))
        lengths.append(n)
        left -= n
    cu = cu_seqlens(lengths)
    q = _random((tokens, heads, head_dim), seed)
    k, v = (_random((tokens, heads // 2, head_dim), seed + i) for i in (1, 2))
    dout = _random((tokens, heads, head_dim), seed + 3)

    def run(fn, *tensors):
        tensors = [t.detach().clone().requires_grad_() for t in tensors]
        out = fn(*tensors)
        out.backward(dout.to(out.dtype))
        return [out.detach()] + [t.grad for t in tensors]

    longest = max(lengths)
    exact = run(lambda *t: naive_tapa_attention_varlen(*t, cu, cu), q.double(), k.double(), v.double())
    kernel = run(lambda *t: tapa_attention_varlen(*t, cu, cu, longest, longest, impl="triton"), q, k, v)
    same = run(lambda *t: tapa_attention_varlen(*t, cu, cu, longest, longest, impl="reference"), q, k, v)

    def rel(a, b):
        return float((a.double() - b).norm() / b.norm())
    return {name: (rel(a, e), rel(b, e))
            for name, a, b, e in zip(("out", "dq", "dk", "dv"), kernel, same, exact)}


def run(args) -> int:
    if not torch.cuda.is_available():
        raise SystemExit("tapa bench varlen: needs a CUDA GPU (the fused kernel is what it times)")
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    command = "tapa bench varlen " + " ".join(sys.argv[3:] if sys.argv[1:2] == ["bench"] else sys.argv[1:])
    lines = [f"# Varlen TAPA kernel, {torch.cuda.get_device_name()}",
             "", f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; torch "
             f"{torch.__version__}, Python {platform.python_version()}; bf16, causal, "
             f"{args.heads} heads; fwd+bwd, do_bench medians.", "", f"Command: `{command}`", ""]
    rows = []
    lines += ["## Equal documents (varlen vs the dense kernel on the same work; target <= 1.05)", "",
              "| D | doc len | docs | varlen ms | dense ms | x dense | fwd x dense |",
              "|---|---|---|---|---|---|---|"]
    for head_dim in args.head_dims:
        for doc_len in args.doc_lens:
            varlen, dense, varlen_fwd, dense_fwd = equal_documents(head_dim, args.heads,
                                                                   args.tokens, doc_len)
            rows.append(dict(case="equal", head_dim=head_dim, row_len=doc_len,
                             docs=args.tokens // doc_len, varlen_ms=varlen, dense_ms=dense,
                             x_dense=varlen / dense, fwd_x_dense=varlen_fwd / dense_fwd))
            lines.append(f"| {head_dim} | {doc_len} | {args.tokens // doc_len} | {varlen:.3f} | "
                         f"{dense:.3f} | {varlen / dense:.3f} | {varlen_fwd / dense_fwd:.3f} |")
            print(lines[-1], flush=True)
    doc_lengths = corpus_document_lengths(args.corpus_bytes, args.vocab_size, args.cache_dir)
    median = sorted(doc_lengths)[len(doc_lengths) // 2]
    no_torch_varlen = ([f"torch {torch.__version__} has no varlen attention "
                        "(torch.nn.attention.varlen): its columns are empty.", ""]
                       if _sdpa_varlen_fn(None, 0) is None else [])
    lines += ["", f"## Packed corpus ({len(doc_lengths)} built-in documents, median {median} "
              f"tokens at vocab {args.vocab_size}; targets: x kept-FLOPs dense <= 1.2, x flex <= 1.25)",
              "", *no_torch_varlen,
              "| D | row len | rows | docs | kept FLOPs | varlen ms | dense row ms | "
              "x dense on kept FLOPs | flex ms | x flex | torch varlen ms | x torch varlen |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for head_dim in args.head_dims:
        for row_len in args.row_lens:
            pack = pack_documents(doc_lengths, row_len, max(1, args.pack_tokens // row_len))
            times, kept, dense_flops, lengths = packed_corpus(head_dim, args.heads, pack,
                                                              flex=not args.no_flex)
            dense_on_kept = times["dense_row"] * kept / dense_flops
            flex = times.get("flex", float("nan"))
            torch_varlen = times.get("sdpa_varlen", float("nan"))
            rows.append(dict(case="corpus", head_dim=head_dim, row_len=row_len, docs=len(lengths),
                             kept_share=kept / dense_flops, varlen_ms=times["varlen"],
                             dense_ms=times["dense_row"], x_dense=times["varlen"] / dense_on_kept,
                             flex_ms=flex, x_flex=times["varlen"] / flex,
                             torch_varlen_ms=torch_varlen, x_torch_varlen=times["varlen"] / torch_varlen))
            lines.append(f"| {head_dim} | {row_len} | {len(pack)} | {len(lengths)} | "
                         f"{kept / dense_flops:.3f} | {times['varlen']:.3f} | "
                         f"{times['dense_row']:.3f} | {times['varlen'] / dense_on_kept:.3f} | "
                         f"{flex:.3f} | {times['varlen'] / flex:.3f} | {torch_varlen:.3f} | "
                         f"{times['varlen'] / torch_varlen:.3f} |")
            print(lines[-1], flush=True)
    lines += ["", "## bf16 accuracy vs float64 (ragged documents, GQA 2:1; target ratio <= 1.5)",
              "", "| D | tensor | kernel | same-dtype reference | ratio |", "|---|---|---|---|---|"]
    for head_dim in args.head_dims:
        for name, (kernel, same) in accuracy(head_dim, args.heads, args.check_tokens).items():
            rows.append(dict(case="accuracy", head_dim=head_dim, tensor=name, kernel_error=kernel,
                             reference_error=same, ratio=kernel / same))
            lines.append(f"| {head_dim} | {name} | {kernel:.2e} | {same:.2e} | {kernel / same:.2f} |")
    write_csv(out_dir / "varlen.csv", rows)
    (out_dir / "varlen.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tapa.bench.varlen", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
