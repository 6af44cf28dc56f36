"""Aten ops per decoding step of the bench model (`tapa bench model`'s shape, bf16 weights), on the
CPU profiler: every aten event, the ops the model's Python calls directly, and those of them that
would launch work on a GPU (not views, not casts that copy nothing). A proxy for a GPU step's kernel
launches, where each costs a few microseconds inside a CUDA graph and more eagerly.

    PYTHONPATH=src python3 lab/kernels/decode_op_count.py rope tapa tapa:LLLG:256 [--stub-tapa]

On CPU the global TAPA layers run the reference op, not the split-KV kernel; --stub-tapa replaces
their attention by one allocation, so that a TAPA row counts the rest of the step (on CUDA add the
kernel's 2 launches per TAPA layer, 3 eagerly)."""

import argparse

import torch
from torch.profiler import ProfilerActivity, profile

from tapa.bench.model import BENCH_MODEL, parse_variant
from tapa.model import ModelConfig, StaticDecoder, TapaLM

VIEWS = {"aten::view", "aten::slice", "aten::select", "aten::transpose", "aten::expand",
         "aten::unsqueeze", "aten::as_strided", "aten::_reshape_alias", "aten::t", "aten::permute",
         "aten::alias", "aten::detach", "aten::resolve_conj", "aten::resolve_neg", "aten::squeeze",
         "aten::unbind", "aten::split", "aten::chunk", "aten::narrow", "aten::empty",
         "aten::empty_strided", "aten::is_nonzero", "aten::item", "aten::_local_scalar_dense",
         "aten::lift_fresh", "aten::result_type"}
MAYBE_COPY = {"aten::to", "aten::reshape", "aten::contiguous", "aten::flatten", "aten::type_as"}


def _copies(event) -> bool:
    return any(c.name in ("aten::_to_copy", "aten::copy_", "aten::clone") or _copies(c)
               for c in event.cpu_children)


def count(step) -> tuple[int, int, int]:
    """(aten events, top-level aten ops, top-level ops that launch work) of one call of step."""
    step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    events = [e for e in prof.events() if e.name.startswith("aten::")]
    top = [e for e in events if not (e.cpu_parent is not None and e.cpu_parent.name.startswith("aten::"))]
    launching = [e for e in top if e.name not in VIEWS and (e.name not in MAYBE_COPY or _copies(e))]
    return len(events), len(top), len(launching)


def stub_tapa() -> None:
    import tapa.model.attention as attention
    import tapa.model.static_decode as static_decode

    attention.Attention._tapa = lambda self, q, k, v, key_slots, ctx: torch.empty_like(q)
    static_decode.tapa_attention_with_kvcache = lambda q, *args, **kwargs: torch.empty_like(q)


@torch.no_grad()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="*", default=["rope", "tapa", "tapa:LLLG:256"])
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--stub-tapa", action="store_true")
    args = parser.parse_args()
    if args.stub_tapa:
        stub_tapa()
    for spec in args.models:
        torch.manual_seed(0)
        model = TapaLM(ModelConfig(**parse_variant(spec), **BENCH_MODEL)).to(torch.bfloat16).eval()
        ids = torch.randint(0, model.config.vocab_size, (1, args.prompt))
        for mode in ("eager", "static"):
            cache = model.new_kv_cache(1, args.prompt + 8)
            model(ids, 0, cache)
            token = ids[:, -1:]
            step = StaticDecoder(model, cache) if mode == "static" else (
                lambda: model(token, cache.length, cache))
            total, top, launching = count((lambda: step(token)) if mode == "static" else step)
            print(f"{spec:14s} {mode:6s} aten events {total:5d}  top-level {top:5d}  launching {launching:4d}")


if __name__ == "__main__":
    main()
