"""The GPU kernels of one static decoding step, by model: what RoPE's step runs that TAPA's does not.

Run 8 (results/kernel-h200/run-8.md) timed `TapaLM.generate` as CUDA graphs: the RoPE model's step
was 1.12-1.17x TAPA's at batch 1, and PLAN.md's rule says the difference is profiled before a
model-level decode ratio is quoted. A graph replay cannot be profiled kernel by kernel, so this
runs the same static step (`tapa.model.StaticDecoder`, no graph) under torch.profiler and sums the
device time of the kernels it launches, per step, by kind (attention, matmul, elementwise, other),
with the most expensive kernels by name. Next to it: the same step as a CUDA graph, timed. The
graph's time less the kernels' sum is what launching and gaps cost inside the graph.

    PYTHONPATH=src python3 lab/kernels/decode_kernel_profile.py --out /tmp/prof     # H200: rope, tapa, hybrid
    PYTHONPATH=src python3 lab/kernels/decode_kernel_profile.py --smoke --out /tmp/p  # the logic, on CPU

On CPU (--smoke, a tiny model) there are no kernels; the aten ops that the step calls directly
stand in for them, so the tables are filled but say nothing about a GPU."""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from tapa.bench.model import BENCH_MODEL, parse_variant
from tapa.model import ModelConfig, StaticDecoder, TapaLM

SMOKE_MODEL = dict(dim=32, n_layers=4, n_heads=2, vocab_size=97)
# substrings of kernel names, first match wins (lower case)
KINDS = (("attention", ("flash", "fmha", "cudnn", "attention", "_decode", "_split_kernel",
                        "_merge_kernel", "splitkv")),
         ("matmul", ("gemm", "gemv", "cutlass", "sm90_xmma", "nvjet", "matmul", "aten::mm", "aten::addmm",
                     "aten::linear", "aten::bmm")),
         ("elementwise", ("elementwise", "vectorized", "unrolled", "reduce", "cat", "copy", "index",
                          "softmax", "where", "aten::")))


def kind_of(name: str) -> str:
    low = name.lower()
    for kind, keys in KINDS:
        if any(k in low for k in keys):
            return kind
    return "other"


def device_events(prof, on_cuda: bool) -> list:
    """(name, microseconds) of every kernel (CUDA) or top-level aten op (CPU) the profile holds."""
    events = prof.events()
    if on_cuda:
        return [(e.name, e.time_range.elapsed_us()) for e in events
                if e.device_type == torch.autograd.DeviceType.CUDA]
    return [(e.name, e.time_range.elapsed_us()) for e in events if e.name.startswith("aten::")
            and not (e.cpu_parent is not None and e.cpu_parent.name.startswith("aten::"))]


@torch.no_grad()
def profile_step(model: TapaLM, batch: int, prompt: int, steps: int, device) -> dict:
    """Kernels per step of the static decoding step, and the graph step's ms where CUDA is there."""
    ids = torch.randint(0, model.config.vocab_size, (batch, prompt), device=device)
    on_cuda = device.type == "cuda"
    out = {}
    cache = model.new_kv_cache(batch, prompt + steps + 8)
    token = model(ids, 0, cache)[:, -1:].argmax(-1)
    decoder = StaticDecoder(model, cache)
    for _ in range(3):  # warm: tuned configurations and allocations settle
        token = decoder(token)[:, -1:].argmax(-1)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_cuda else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            token = decoder(token)[:, -1:].argmax(-1)
        if on_cuda:
            torch.cuda.synchronize()
    by_name = defaultdict(lambda: [0, 0.0])
    for name, us in device_events(prof, on_cuda):
        by_name[name][0] += 1
        by_name[name][1] += us
    out["kernels"] = {name: (n / steps, us / steps) for name, (n, us) in by_name.items()}
    out["kernels_per_step"] = sum(n for n, _ in out["kernels"].values())
    out["kernel_us_per_step"] = sum(us for _, us in out["kernels"].values())
    if on_cuda:
        cache = model.new_kv_cache(batch, prompt + steps + 8)
        token = model(ids, 0, cache)[:, -1:].argmax(-1)
        graph = StaticDecoder(model, cache, cuda_graph=True)
        token = graph(token)[:, -1:].argmax(-1)  # captures
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(steps):
            token = graph(token)[:, -1:].argmax(-1)
        torch.cuda.synchronize()
        out["graph_ms"] = (time.perf_counter() - start) * 1e3 / steps
    return out


def report(rows: list[dict], top: int) -> str:
    lines = ["| model | batch | prompt | kernels / step | kernel ms / step | graph ms / step | graph - kernels ms | "
             + " | ".join(f"{k} ms (n)" for k, _ in KINDS) + " | other ms (n) |",
             "|---|---|---|---|---|---|---|" + "---|" * (len(KINDS) + 1)]
    for r in rows:
        kinds = defaultdict(lambda: [0.0, 0.0])
        for name, (n, us) in r["kernels"].items():
            kinds[kind_of(name)][0] += n
            kinds[kind_of(name)][1] += us
        graph = r.get("graph_ms")
        cells = [f"{kinds[k][1] / 1e3:.4f} ({kinds[k][0]:.0f})" for k, _ in KINDS + (("other", ()),)]
        lines.append(f"| {r['model']} | {r['batch']} | {r['prompt']} | {r['kernels_per_step']:.0f} | "
                     f"{r['kernel_us_per_step'] / 1e3:.4f} | "
                     + (f"{graph:.4f} | {graph - r['kernel_us_per_step'] / 1e3:.4f} | " if graph else "- | - | ")
                     + " | ".join(cells) + " |")
    for r in rows:
        lines += ["", f"**{r['model']}, batch {r['batch']}, prompt {r['prompt']}: the {top} costliest kernels "
                  "per step**", "", "| kernel | kind | launches / step | µs / step |", "|---|---|---|---|"]
        ranked = sorted(r["kernels"].items(), key=lambda item: -item[1][1])[:top]
        for name, (n, us) in ranked:
            short = name if len(name) <= 90 else name[:87] + "..."
            lines.append(f"| `{short}` | {kind_of(name)} | {n:.0f} | {us:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="*", default=["rope", "tapa", "tapa:LLLG:256"])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--prompt-lens", type=int, nargs="+", default=[4096, 32768])
    parser.add_argument("--steps", type=int, default=20, help="profiled steps (default 20)")
    parser.add_argument("--top", type=int, default=12, help="kernels listed per row (default 12)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--smoke", action="store_true", help="tiny model on CPU: tests the logic, not the GPU")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    if not args.smoke and not torch.cuda.is_available():
        parser.error("needs a CUDA GPU (or --smoke for the logic on CPU)")
    device = torch.device("cpu" if args.smoke else "cuda")
    dtype = torch.float32 if args.smoke else torch.bfloat16
    shape = SMOKE_MODEL if args.smoke else BENCH_MODEL
    batches, lengths = ([1], [24]) if args.smoke else (args.batch, args.prompt_lens)
    rows = []
    args.out.mkdir(parents=True, exist_ok=True)
    for spec in args.models:
        try:
            cfg = ModelConfig(**parse_variant(spec), **shape)
        except ValueError as err:
            parser.error(str(err))
        torch.manual_seed(0)
        model = TapaLM(cfg).to(device=device, dtype=dtype).eval()
        for batch in batches:
            for length in lengths:
                row = {"model": spec, "batch": batch, "prompt": length,
                       **profile_step(model, batch, length, args.steps, device)}
                rows.append(row)
                print(f"{spec} batch {batch} prompt {length}: {row['kernels_per_step']:.0f} kernels, "
                      f"{row['kernel_us_per_step'] / 1e3:.4f} ms of kernels per step"
                      + (f", graph {row['graph_ms']:.4f} ms" if "graph_ms" in row else ""), flush=True)
                text = (f"# Kernels of one static decoding step\n\n- command: `python3 {' '.join(sys.argv)}`\n"
                        f"- device: {torch.cuda.get_device_name() if device.type == 'cuda' else 'CPU (smoke: aten ops, not kernels)'}; "
                        f"torch {torch.__version__}\n- {args.steps} profiled steps per row, after 3 warm-up steps\n\n"
                        + report(rows, args.top))
                (args.out / "decode_kernels.md").write_text(text)
        del model
    print(f"wrote {args.out / 'decode_kernels.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
