"""`tapa bench decode`: one decoding step of TAPA (split-KV kernel) against SDPA on a RoPE-style
model of the same shapes (bf16, GQA).

Per (batch, cache length) the step is one new query token per sequence against a full cache:
q (B, 1, H, D), k/v cache (B, S, Hk, D). Both sides read the same cache tensors, stored as
(B, Hk, S, D) like transformers' caches: SDPA takes them as they are (enable_gqa, no repeat), the
TAPA kernel through a transposed view. SDPA is timed with each backend that accepts the shapes
(flash, efficient, cuDNN) and with torch's own choice (auto); the anchor is the fastest. The RoPE
rotation of the new q and k is left out on both sides (TAPA needs none; it is tiny for RoPE). Times are triton.testing.do_bench medians
(L2 flushed between runs). Before its timed runs each shape's first TAPA call is timed by the
wall clock (tapa_first_ms: the plan, and the autotuning where the shape's bucket is new). First
the kernel is checked against the float64 reference on the GPU (which compiles it). Where a
shape's first call autotuned, the autotuner's time for each tile is kept (decode_tiles.csv, and a
table in decode.md): how far each fixed tile is from the one picked, i.e. what the tuning buys.

Writes to --out: decode.csv (every timing), decode.md (table of ratios + command, date, GPU),
decode.png (ratio vs cache length), decode_tiles.csv (the tiles' times, where tuning ran).
--smoke runs tiny shapes on CPU through the Triton interpreter (wall-clock timing; numbers
meaningless) to test this script's logic.

--profile looks for the per-step floor at one shape (--profile-batch, --profile-cache): launches
and allocations per step (torch.profiler), host time per call against device time (eager, and a
CUDA-graph replay of the same step), SDPA's host time per call on the same tensors, the host
pieces (the launch plan lookup, allocations), a cProfile of the Python wrapper, and the step time
by number of splits (1 = one launch).
Writes decode_profile.md and decode_profile_cprofile.txt.

--splits N ... times TAPA's step at each number of splits (as the kernel rounds it: whole
aligned blocks per split) at every shape, next to the split count `default_num_splits` picks, so
that its heuristic can be checked shape by shape. Writes decode_splits.csv and decode_splits.md.

--graphs also times every step, TAPA's and each SDPA backend's, as a CUDA-graph replay and adds
those ratios to decode.csv/decode.md: the cost of the step with the launch path taken out, as
serving stacks (vLLM, SGLang, torch.compile's reduce-overhead) run decode steps.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from tapa._paths import write_csv

TARGET_RATIO = 1.2
SDPA_BACKENDS = ("flash", "efficient", "cudnn")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--cache", type=int, nargs="+",
                        default=[4096, 8192, 16384, 32768, 65536, 131072], help="cache lengths S")
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--theta", type=float, default=0.5)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    parser.add_argument("--out", type=Path, default=Path("runs/bench/decode"),
                        help="output directory (default: %(default)s)")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny shapes on CPU via the Triton interpreter: tests the script, not speed")
    parser.add_argument("--graphs", action="store_true",
                        help="also time every step as a CUDA-graph replay (how serving stacks run decode "
                             "steps: no launch or Python cost), TAPA against SDPA")
    parser.add_argument("--profile", action="store_true",
                        help="also profile one decode step at --profile-batch x --profile-cache")
    parser.add_argument("--profile-batch", type=int, default=1)
    parser.add_argument("--profile-cache", type=int, default=4096)
    parser.add_argument("--splits", type=int, nargs="+", default=None, metavar="N",
                        help="also time TAPA's step at each of these numbers of splits, at every shape, "
                             "next to the default's choice (CUDA-graph replays with --graphs, else "
                             "eager): decode_splits.csv / decode_splits.md")


def _kernel_module():
    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernel is defined
    from tapa.ops.tapa import decode_kernel

    return decode_kernel


def _is_device_fault(err: RuntimeError) -> bool:
    return isinstance(err, getattr(torch, "AcceleratorError", ())) or "CUDA error" in str(err)


def _sdpa_backend(name):
    from torch.nn.attention import SDPBackend

    return {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
            "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}[name]


def _timer(smoke: bool):
    """Median milliseconds of fn: do_bench on the GPU, wall clock in the smoke run."""
    if not smoke:
        from triton.testing import do_bench

        return lambda fn: do_bench(fn, warmup=25, rep=100, return_mode="median")

    def wall(fn, repeats=1):
        fn()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
        return statistics.median(times)

    return wall


def check_accuracy(kernel, *, device, dtype, heads, kv_heads, head_dim, theta, cache=4093, batch=3):
    """Relative RMSE vs float64 of the kernel and of the same-dtype reference, ragged lengths."""
    from tapa.ops.tapa.reference import naive_tapa_attention

    gen = torch.Generator().manual_seed(0)
    q = torch.randn(batch, 1, heads, head_dim, generator=gen).to(device, dtype)
    k = torch.randn(batch, kv_heads, cache, head_dim, generator=gen).to(device, dtype).transpose(1, 2)
    v = torch.randn(batch, kv_heads, cache, head_dim, generator=gen).to(device, dtype).transpose(1, 2)
    lengths = torch.randint(1, cache + 1, (batch,), generator=gen, dtype=torch.int32)
    lengths[0] = cache
    out = kernel.tapa_decode_attention(q, k, v, lengths.to(device), theta=theta)
    errors = {"kernel": 0.0, "reference": 0.0}
    for row, length in enumerate(lengths.tolist()):
        args = dict(theta=theta, q_offset=length - 1)
        exact = naive_tapa_attention(q[row:row + 1].double(), k[row:row + 1, :length].double(),
                                     v[row:row + 1, :length].double(), **args)
        same = naive_tapa_attention(q[row:row + 1], k[row:row + 1, :length], v[row:row + 1, :length], **args)
        for name, result in (("kernel", out[row:row + 1]), ("reference", same)):
            err = float((result.double() - exact).norm() / exact.norm())
            errors[name] = max(errors[name], err)
    return errors


def full_cache(*, batch, cache, heads, kv_heads, head_dim, dtype, device):
    """One decoding step's inputs: q (B, 1, H, D), a full k/v cache stored (B, Hk, S, D) as
    transformers' caches are, and its lengths (every slot valid)."""
    q = torch.randn(batch, 1, heads, head_dim, device=device, dtype=dtype)
    k_cache = torch.randn(batch, kv_heads, cache, head_dim, device=device, dtype=dtype)
    v_cache = torch.randn(batch, kv_heads, cache, head_dim, device=device, dtype=dtype)
    return q, k_cache, v_cache, torch.full((batch,), cache, dtype=torch.int32, device=device)


def decode_step(kernel, q, k_cache, v_cache, lengths, theta):
    """TAPA's decoding step on a (B, Hk, S, D) cache, through its transposed view:
    step(num_splits=None) (None: the kernel's default split count)."""
    k_view, v_view = k_cache.transpose(1, 2), v_cache.transpose(1, 2)

    def step(num_splits=None):
        return kernel.tapa_decode_attention(q, k_view, v_view, lengths, theta=theta, check_lengths=False,
                                            num_splits=num_splits)
    return step


def first_call_ms(step, device: torch.device) -> float:
    """Wall milliseconds of a step's first call at its shape: the launch plan, on a GPU the
    autotuner's trial of every decode tile where the shape's split or program bucket is new (and
    Triton's compiles, if nothing has run the kernel before). A server pays it when a new batch
    size or cache bucket first arrives; the timed steps after it do not."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    step()
    sync()
    return (time.perf_counter() - start) * 1e3


def sdpa_step(q, k_cache, v_cache, backend=None):
    """The anchor's step on the same tensors: SDPA of q (B, 1, H, D) against the (B, Hk, S, D)
    cache (enable_gqa, no repeat), with one backend, or torch's own choice (backend None)."""
    from torch.nn.attention import sdpa_kernel

    q_sdpa = q.transpose(1, 2)  # (B, H, 1, D)

    def step():
        if backend is None:
            return F.scaled_dot_product_attention(q_sdpa, k_cache, v_cache, enable_gqa=True)
        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(q_sdpa, k_cache, v_cache, enable_gqa=True)
    return step


def bench_shape(kernel, timer, *, batch, cache, heads, kv_heads, head_dim, theta, dtype, device,
                graphs=False):
    """({variant: ms}, {variant: ms}) for one step at (batch, cache): the eager step (and TAPA's
    first call, "tapa_first"), and with graphs the same step replayed from a CUDA graph (variants
    that cannot be captured left out)."""
    q, k_cache, v_cache, lengths = full_cache(batch=batch, cache=cache, heads=heads, kv_heads=kv_heads,
                                              head_dim=head_dim, dtype=dtype, device=device)
    tapa_step = decode_step(kernel, q, k_cache, v_cache, lengths, theta)
    steps = {"tapa": tapa_step}
    first = first_call_ms(tapa_step, device)
    times = {"tapa": timer(tapa_step), "tapa_first": first}
    backends = SDPA_BACKENDS if device.type == "cuda" else ("math",)
    for name in backends:
        step = sdpa_step(q, k_cache, v_cache, _sdpa_backend(name))
        try:
            step()
        except RuntimeError as err:  # this backend does not take these shapes / this GPU
            if _is_device_fault(err):  # a kernel fault poisons the context: never swallow it
                raise
            continue
        times[f"sdpa_{name}"] = timer(step)
        steps[f"sdpa_{name}"] = step
    if device.type == "cuda":  # whatever torch picks by itself (an anchor even if none above runs)
        steps["sdpa_auto"] = sdpa_step(q, k_cache, v_cache)
        times["sdpa_auto"] = timer(steps["sdpa_auto"])
    graph_times = {}
    if graphs:
        for name, step in steps.items():
            graph_ms = _graph_ms(step, timer)
            if graph_ms is not None:
                graph_times[name] = graph_ms
    return times, graph_times


def split_sweep(kernel, timer, *, batch, cache, heads, kv_heads, head_dim, theta, dtype, device,
                splits, graphs=False) -> dict:
    """TAPA's step at (batch, cache) with each of `splits` (the kernel's effective count, each
    once) and with its default: {"default": effective default, "times": {splits: ms}, "mode"}."""
    q, k_cache, v_cache, lengths = full_cache(batch=batch, cache=cache, heads=heads, kv_heads=kv_heads,
                                              head_dim=head_dim, dtype=dtype, device=device)
    step = decode_step(kernel, q, k_cache, v_cache, lengths, theta)

    def effective(n):
        return kernel.split_layout(batch, kv_heads, cache, device, n)[0]

    use_graphs = graphs and device.type == "cuda"
    counts = {effective(None): None}
    for n in splits:
        counts.setdefault(effective(n), n)
    times = {}
    for count, n in sorted(counts.items()):
        step(n)  # compile and tune first
        times[count] = _graph_ms(lambda n=n: step(n), timer) if use_graphs else None
    if None in times.values():  # eager, or a capture failed: every count eager, so they compare
        use_graphs = False
        times = {count: timer(lambda n=n: step(n)) for count, n in sorted(counts.items())}
    return {"default": effective(None), "times": times, "mode": "graph" if use_graphs else "eager"}


def write_splits(out: Path, sweeps: list[dict], *, command: str, device_name: str, smoke: bool) -> None:
    """decode_splits.csv (one row per shape and split count) and decode_splits.md."""
    rows = [{"batch": s["batch"], "cache": s["cache"], "splits": n, "ms": ms, "default": n == s["default"],
             "mode": s["mode"]} for s in sweeps for n, ms in s["times"].items()]
    write_csv(out / "decode_splits.csv", rows)
    lines = ["# TAPA decode step by number of splits", "", f"- command: `{command}`", f"- device: {device_name}",
             f"- times in ms ({'/'.join(sorted({s['mode'] for s in sweeps})) or 'eager'}; "
             "triton.testing.do_bench medians); "
             "splits as the kernel runs them (each split a whole number of aligned key blocks)"]
    if smoke:
        lines.append("- SMOKE RUN on CPU through the Triton interpreter: the times say nothing about speed")
    lines += ["", "| batch | cache | mode | default splits | default ms | best splits | best ms | default / best | every count (splits: ms) |",
              "|---|---|---|---|---|---|---|---|---|"]
    for s in sweeps:
        best = min(s["times"], key=s["times"].get)
        default_ms = s["times"][s["default"]]
        every = ", ".join(f"{n}: {ms:.4f}" for n, ms in s["times"].items())
        lines.append(f"| {s['batch']} | {s['cache']} | {s['mode']} | {s['default']} | {default_ms:.4f} | {best} | "
                     f"{s['times'][best]:.4f} | {default_ms / s['times'][best]:.2f} | {every} |")
    (out / "decode_splits.md").write_text("\n".join(lines) + "\n")


def fastest_sdpa(times: dict) -> str | None:
    """The SDPA variant ("sdpa_<backend>") with the lowest time, None if none ran."""
    sdpa = {name: ms for name, ms in times.items() if name.startswith("sdpa_")}
    return min(sdpa, key=sdpa.get) if sdpa else None


# ---------------------------------------------------------------------------------------------
# The per-step floor


def _host_ms(fn, calls: int) -> float:
    """Host milliseconds per call, calls enqueued back to back (no sync inside the loop)."""
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    host = (time.perf_counter() - start) * 1e3 / calls
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return host


def _graph_ms(step, timer):
    """Device time of the step replayed from a CUDA graph (no launch or Python cost), or None."""
    if not torch.cuda.is_available():
        return None
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                step()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        return timer(graph.replay)
    except RuntimeError as err:  # a step that cannot be captured is itself a finding
        if _is_device_fault(err):  # a kernel fault poisons the context: never swallow it
            raise
        print(f"CUDA graph capture of the decode step failed: {str(err).splitlines()[0]}", file=sys.stderr)
        return None


def _profile_counts(step, steps: int) -> dict:
    """Per step: GPU kernels launched (and their names), device time of those kernels, CPU-side
    allocations (aten::empty*) and the launch calls the profiler saw."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    step()
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    kernels, names, device_us, allocations, launches = 0, {}, 0.0, 0, 0
    for event in prof.events():
        if getattr(event, "device_type", None) == DeviceType.CUDA:
            kernels += 1
            names[event.name] = names.get(event.name, 0) + 1
            device_us += event.time_range.elapsed_us()
        elif event.name.startswith("aten::empty"):
            allocations += 1
        elif "LaunchKernel" in event.name:
            launches += 1
    return dict(kernels=kernels / steps, device_us=device_us / steps, allocations=allocations / steps,
                launch_calls=launches / steps,
                kernel_names={name: count / steps for name, count in names.items()},
                table=prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))


def profile_step(kernel, timer, *, batch, cache, heads, kv_heads, head_dim, theta, dtype, device,
                 smoke=False) -> dict:
    """The floor of one decode step at (batch, cache): see the module docstring."""
    import cProfile
    import io
    import pstats

    q, k_cache, v_cache, lengths = full_cache(batch=batch, cache=cache, heads=heads, kv_heads=kv_heads,
                                              head_dim=head_dim, dtype=dtype, device=device)
    step = decode_step(kernel, q, k_cache, v_cache, lengths, theta)
    k_view, v_view = k_cache.transpose(1, 2), v_cache.transpose(1, 2)

    step()  # compile and autotune
    calls = 3 if smoke else 300
    result = dict(batch=batch, cache=cache, host_ms=_host_ms(step, calls), eager_ms=timer(step))
    # the anchor's host path at the same shapes: whether TAPA's launch path costs more than SDPA's
    anchor = sdpa_step(q, k_cache, v_cache)
    anchor()
    result["sdpa_host_ms"] = _host_ms(anchor, calls)
    result["graph_ms"] = _graph_ms(step, timer)
    pieces = {  # the checks and launch arithmetic run once per call signature; a step looks them up
        "launch plan lookup (checks, launch arguments)": lambda: kernel._plan(
            q, k_view, v_view, lengths, None, theta, 0.1, "power", "quadratic", None),
        "torch.empty x4 (out, lse, partials)": lambda: [torch.empty(batch, 1, heads, head_dim, device=device)
                                                        for _ in range(4)],
    }
    result["pieces_ms"] = {name: _host_ms(fn, calls) for name, fn in pieces.items()}
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        step()
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(30)
    result["cprofile"] = f"{calls} calls of tapa_decode_attention, batch {batch}, cache {cache}\n" + text.getvalue()
    result["profile"] = _profile_counts(step, 3 if smoke else 20)
    splits = [1, 2, 4, 8, 16, 32, 64] if not smoke else [1, 2]
    result["splits_ms"] = {n: timer(lambda n=n: step(n)) for n in splits}
    return result


def write_profile(out: Path, result: dict, *, sdpa: dict, command: str, device_name: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    prof = result["profile"]

    def ms(value):
        return "n/a" if value is None else f"{value:.4f}"

    best = fastest_sdpa(sdpa)
    lines = [f"# Decode step floor: batch {result['batch']}, cache {result['cache']}", "",
             f"- command: `{command}`", f"- device: {device_name}",
             f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}", "",
             "| measure | ms |", "|---|---|",
             f"| host time per call (enqueue, no sync) | {ms(result['host_ms'])} |",
             f"| SDPA's host time per call (torch's choice of backend, the same tensors) | "
             f"{ms(result['sdpa_host_ms'])} |",
             f"| eager step (do_bench median; wall clock in --smoke) | {ms(result['eager_ms'])} |",
             f"| CUDA-graph replay of the step | {ms(result['graph_ms'])} |",
             f"| GPU kernel time per step (profiler) | {ms(prof['device_us'] / 1e3)} |"]
    if best:
        lines.append(f"| best SDPA ({best[5:]}) | {ms(sdpa[best])} |")
    lines += [f"| host: {name} | {ms(value)} |" for name, value in result["pieces_ms"].items()]
    lines += ["", f"Per step: {prof['kernels']:.1f} GPU kernels, {prof['launch_calls']:.1f} launch calls seen, "
              f"{prof['allocations']:.1f} aten::empty calls. Kernels: "
              + ", ".join(f"{name} x{count:.1f}" for name, count in prof["kernel_names"].items()), "",
              "Step time by number of splits (1 = a single launch, no merge kernel):", "",
              "| splits | ms |", "|---|---|"]
    lines += [f"| {n} | {ms(value)} |" for n, value in result["splits_ms"].items()]
    lines += ["", "Profiler, top CPU ops:", "", "```", prof["table"], "```"]
    (out / "decode_profile.md").write_text("\n".join(lines) + "\n")
    (out / "decode_profile_cprofile.txt").write_text(result["cprofile"])


def _gpu_name(device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU ({platform.processor() or 'unknown'}), Triton interpreter"


def graph_columns(graph_times: dict) -> dict:
    """The CUDA-graph columns of a row: TAPA's replay time, the fastest SDPA replay and their
    ratio (None where a side could not be captured, e.g. on CPU)."""
    tapa, best = graph_times.get("tapa"), fastest_sdpa(graph_times)
    if tapa is None or best is None:
        return {"tapa_graph_ms": tapa, "best_sdpa_graph": None, "graph_ratio": None}
    return {"tapa_graph_ms": tapa, "best_sdpa_graph": best[5:], "best_sdpa_graph_ms": graph_times[best],
            "graph_ratio": tapa / graph_times[best]}


def tile_rows(batch: int, cache: int, trials: list[dict]) -> list[dict]:
    """Rows of decode_tiles.csv for the autotunings a shape's first call ran (`tile_trials`
    records): the tile picked and each tile's median ms of the split kernel."""
    return [{"batch": batch, "cache": cache, "picked": trial["best"],
             **{f"tile_{name}_ms": ms for name, ms in trial["tiles_ms"].items()}} for trial in trials]


def tile_lines(tiles: list[dict]) -> list[str]:
    """decode.md's autotuning section: per tuned shape each tile's time over the picked tile's,
    then each tile's worst such ratio over the shapes (1.00: that one fixed tile would have done
    as well as the tuning everywhere here)."""
    if not tiles:
        return ["", "No autotuning ran in the timed shapes (their buckets were tuned before them, or the "
                "Triton interpreter ran its one fixed tile)."]
    names = sorted({key[5:-3] for row in tiles for key in row if key.startswith("tile_")},
                   key=lambda name: tuple(int(part) for part in name.split("x")))

    ratios = []  # per tuned shape: {tile: its time over the picked tile's}
    for row in tiles:
        picked = row.get(f"tile_{row['picked']}_ms")
        ratios.append({name: row[f"tile_{name}_ms"] / picked for name in names
                       if picked and f"tile_{name}_ms" in row})
    lines = ["", f"**Autotuning** ({len(tiles)} of the shapes' first calls tuned a new bucket): each "
             "tile's split-kernel time over the picked tile's, as the autotuner timed them (do_bench "
             "medians).", "",
             "| batch | cache | picked | " + " | ".join(names) + " |", "|---|---|---|" + "---|" * len(names)]
    for row, ratio in zip(tiles, ratios):
        lines.append(f"| {row['batch']} | {row['cache']} | {row['picked']} | "
                     + " | ".join(f"{ratio[name]:.2f}" if name in ratio else "n/a" for name in names) + " |")
    worst = {name: max(r[name] for r in ratios if name in r) for name in names if any(name in r for r in ratios)}
    if worst:
        fixed = min(worst, key=worst.get)
        lines += ["", "Worst over the tuned shapes: " + ", ".join(
            f"{name} {w:.2f}x" for name, w in worst.items()) + f". The best fixed tile, {fixed}, is at "
            f"most {worst[fixed]:.2f}x the tuned choice."]
    return lines


def write_results(out: Path, rows: list[dict], *, errors: dict, command: str, device_name: str,
                  smoke: bool, shapes: dict, dtype: torch.dtype, tiles: list[dict] = ()) -> None:
    out.mkdir(parents=True, exist_ok=True)
    sdpa_columns = sorted({key for row in rows for key in row if key.startswith("sdpa_")})
    write_csv(out / "decode.csv", rows)
    if tiles:
        write_csv(out / "decode_tiles.csv", list(tiles))
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# TAPA split-KV decode step vs SDPA (same shapes)", "",
        f"- command: `{command}`",
        f"- date: {date}",
        f"- device: {device_name}",
        f"- torch {torch.__version__}, triton {_triton_version()}, python {platform.python_version()}",
        f"- shapes: one new token per sequence against a full cache of S tokens; {shapes['heads']} q heads, "
        f"{shapes['kv_heads']} kv heads, head dim {shapes['head_dim']}, {str(dtype).replace('torch.', '')}",
        "- times: triton.testing.do_bench medians in ms (L2 flushed); TAPA GB/s = k+v cache bytes / TAPA time",
        f"- accuracy (max rel. RMSE vs float64, ragged lengths): kernel {errors['kernel']:.2e}, "
        f"same-dtype reference {errors['reference']:.2e}",
        f"- ratio = TAPA time / fastest SDPA backend time (target <= {TARGET_RATIO})",
    ]
    if smoke:
        lines.append("- SMOKE RUN on CPU through the Triton interpreter: the times say nothing about speed")
    lines += ["", "| batch | cache | TAPA ms | " + " | ".join(c[:-3] + " ms" for c in sdpa_columns)
              + " | best SDPA | ratio | TAPA GB/s | TAPA first call ms |",
              "|---|---|---|" + "---|" * len(sdpa_columns) + "---|---|---|---|"]
    for row in rows:
        sdpa = " | ".join(f"{row[c]:.4f}" if c in row else "n/a" for c in sdpa_columns)
        lines.append(f"| {row['batch']} | {row['cache']} | {row['tapa_ms']:.4f} | {sdpa} | "
                     f"{row['best_sdpa']} | {row['ratio']:.2f} | {row['tapa_gbps']:.0f} | {row['tapa_first_ms']:.1f} |")
    worst = max(rows, key=lambda r: r["ratio"])
    slowest = max(rows, key=lambda r: r["tapa_first_ms"])
    lines += ["", f"Worst ratio {worst['ratio']:.2f} at batch {worst['batch']}, cache {worst['cache']}; "
              f"{sum(r['ratio'] <= TARGET_RATIO for r in rows)} of {len(rows)} shapes within {TARGET_RATIO}x.",
              "", "TAPA's first call at each shape, in the order above (wall clock: the launch plan, and the "
              "autotuner's trial of the decode tiles where the shape's split or program bucket is new; the "
              "accuracy check before them compiled the kernels): median "
              f"{statistics.median(r['tapa_first_ms'] for r in rows):.1f} ms, most "
              f"{slowest['tapa_first_ms']:.1f} ms at batch {slowest['batch']}, cache {slowest['cache']}."]
    lines += tile_lines(list(tiles))
    if any("graph_ratio" in row for row in rows):
        lines += ["", "**As CUDA-graph replays** (`--graphs`: each step captured once and replayed, as "
                  "serving stacks run decode steps; no launch or Python cost on either side):", "",
                  "| batch | cache | TAPA ms | best SDPA | SDPA ms | ratio |", "|---|---|---|---|---|---|"]
        captured = [r for r in rows if r.get("graph_ratio") is not None]
        for row in rows:
            if row.get("graph_ratio") is None:
                lines.append(f"| {row['batch']} | {row['cache']} | n/a | n/a | n/a | n/a (no capture) |")
            else:
                lines.append(f"| {row['batch']} | {row['cache']} | {row['tapa_graph_ms']:.4f} | "
                             f"{row['best_sdpa_graph']} | {row['best_sdpa_graph_ms']:.4f} | {row['graph_ratio']:.2f} |")
        if captured:
            lines += ["", f"As graphs: {sum(r['graph_ratio'] <= TARGET_RATIO for r in captured)} of "
                      f"{len(captured)} captured shapes within {TARGET_RATIO}x."]
    (out / "decode.md").write_text("\n".join(lines) + "\n")
    _plot(out, rows)


def _triton_version() -> str:
    try:
        import triton

        return triton.__version__
    except ImportError:
        return "n/a"


def _plot(out: Path, rows: list[dict]) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    for batch in sorted({r["batch"] for r in rows}):
        mine = [r for r in rows if r["batch"] == batch]
        ax.plot([r["cache"] for r in mine], [r["ratio"] for r in mine], marker="o", label=f"batch {batch}")
    ax.axhline(TARGET_RATIO, color="gray", linestyle="--", label=f"target {TARGET_RATIO}x")
    ax.axhline(1.0, color="black", linewidth=0.5)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("cache length")
    ax.set_ylabel("TAPA time / best SDPA time")
    ax.set_title("decode step, lower is better")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "decode.png", dpi=120)
    plt.close(fig)


def run(args) -> int:
    if not torch.cuda.is_available() and not args.smoke:
        raise SystemExit("tapa bench decode needs a CUDA GPU (or --smoke to test the script on CPU)")
    if args.splits and any(n < 1 for n in args.splits):
        raise SystemExit(f"tapa bench decode: --splits takes positive numbers, got {args.splits}")
    if args.smoke:
        shapes = dict(heads=4, kv_heads=2, head_dim=32)
        batches, caches, device, dtype = [1, 2], [48, 96], torch.device("cpu"), torch.float16
        check_cache = 70
    else:
        shapes = dict(heads=args.heads, kv_heads=args.kv_heads, head_dim=args.head_dim)
        batches, caches, device = args.batch, args.cache, torch.device("cuda")
        dtype, check_cache = getattr(torch, args.dtype), 4093
    kernel = _kernel_module()
    timer = _timer(args.smoke)
    errors = check_accuracy(kernel, device=device, dtype=dtype, theta=args.theta, cache=check_cache, **shapes)
    print(f"accuracy vs float64: kernel {errors['kernel']:.2e}, same-dtype reference {errors['reference']:.2e}")
    if errors["kernel"] > 2 * errors["reference"] + 1e-6:
        raise SystemExit("tapa bench decode: the kernel's error exceeds 2x the reference's; not timing")
    rows, tiles = [], []
    from tqdm import tqdm

    argv = sys.argv[3:] if sys.argv[1:3] == ["bench", "decode"] else sys.argv[1:]
    command = ("tapa bench decode " + " ".join(argv)).strip()

    for batch in batches:
        for cache in tqdm(caches, desc=f"batch {batch}", disable=None):
            tuned = len(kernel.tile_trials())
            times, graph_times = bench_shape(kernel, timer, batch=batch, cache=cache, theta=args.theta,
                                             dtype=dtype, device=device, graphs=args.graphs, **shapes)
            tiles += tile_rows(batch, cache, kernel.tile_trials()[tuned:])
            best = fastest_sdpa(times)
            if best is None:
                raise SystemExit(f"no SDPA backend ran batch {batch}, cache {cache}")
            sdpa = {name: ms for name, ms in times.items() if name.startswith("sdpa_")}
            cache_bytes = 2 * batch * cache * shapes["kv_heads"] * shapes["head_dim"] * dtype.itemsize
            row = {"batch": batch, "cache": cache, "tapa_ms": times["tapa"], "tapa_first_ms": times["tapa_first"],
                   **{f"{name}_ms": ms for name, ms in sdpa.items()},
                   "best_sdpa": best[5:], "ratio": times["tapa"] / sdpa[best],
                   "tapa_gbps": cache_bytes / (times["tapa"] * 1e-3) / 1e9}
            graph_line = ""
            if args.graphs:
                row.update(graph_columns(graph_times))
                if row["graph_ratio"] is not None:
                    graph_line = (f"; as CUDA graphs: tapa {row['tapa_graph_ms']:.4f} ms, "
                                  f"ratio {row['graph_ratio']:.2f}")
            rows.append(row)
            print(f"batch {batch:3d} cache {cache:7d}: tapa {times['tapa']:.4f} ms, best sdpa "
                  f"({best[5:]}) {sdpa[best]:.4f} ms, ratio {row['ratio']:.2f}{graph_line}", flush=True)
            if device.type == "cuda":
                torch.cuda.empty_cache()
            # after every shape, so that a run cut short keeps what it measured
            write_results(args.out, rows, errors=errors, command=command, device_name=_gpu_name(device),
                          smoke=args.smoke, shapes=shapes, dtype=dtype, tiles=tiles)
    print(f"wrote {args.out}/decode.csv, decode.md, decode.png")
    if args.splits:
        sweeps = []
        for batch in batches:
            for cache in tqdm(caches, desc=f"splits, batch {batch}", disable=None):
                sweep = split_sweep(kernel, timer, batch=batch, cache=cache, theta=args.theta, dtype=dtype,
                                    device=device, splits=args.splits, graphs=args.graphs, **shapes)
                sweeps.append({"batch": batch, "cache": cache, **sweep})
                best = min(sweep["times"], key=sweep["times"].get)
                print(f"batch {batch:3d} cache {cache:7d}: default {sweep['default']} splits "
                      f"{sweep['times'][sweep['default']]:.4f} ms, best {best} splits "
                      f"{sweep['times'][best]:.4f} ms", flush=True)
                write_splits(args.out, sweeps, command=command, device_name=_gpu_name(device), smoke=args.smoke)
                if device.type == "cuda":
                    torch.cuda.empty_cache()
        print(f"wrote {args.out}/decode_splits.csv, decode_splits.md")
    if args.profile:
        batch, cache = (1, caches[0]) if args.smoke else (args.profile_batch, args.profile_cache)
        sdpa, _ = bench_shape(kernel, timer, batch=batch, cache=cache, theta=args.theta, dtype=dtype,
                              device=device, **shapes)
        sdpa = {name: ms for name, ms in sdpa.items() if name.startswith("sdpa_")}
        result = profile_step(kernel, timer, batch=batch, cache=cache, theta=args.theta, dtype=dtype,
                              device=device, smoke=args.smoke, **shapes)
        write_profile(args.out, result, sdpa=sdpa, command=command, device_name=_gpu_name(device))
        print((args.out / "decode_profile.md").read_text().split("Profiler, top CPU ops")[0])
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m tapa.bench.decode")
    add_arguments(parser)
    sys.exit(run(parser.parse_args()))
