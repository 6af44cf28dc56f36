"""`tapa bench local`: one local (sliding-window) attention layer against full causal attention.

Per sequence length N (batch * N fixed, bf16, GQA optional) times the forward and the
forward+backward of `local_attention` (FlexAttention by default) at each window, and, in the same
run, SDPA full causal attention with the FLASH_ATTENTION backend (FlashAttention-2) and with
CUDNN_ATTENTION. Times are triton.testing.do_bench medians. Reported per window and N:

- local / flash: fwd+bwd time of the local layer over SDPA-flash causal (the issue's target: at
  most 0.15 at N = 32k, w = 256);
- ideal: the fraction of causal attention's work that the window leaves, visible (query, key)
  pairs of the window over those of full causal (about 2w / N);
- (local/flash) / ideal: how far the layer is from turning that saving into time (1: all of it);
- TFLOP/s over the visible pairs only: 4 * B * H * pairs * D, backward 2.5x the forward.

Before timing, the local op is checked on the GPU against the dense float64 spec (forward and the
gradients of q, k, v), next to the same-dtype dense reference (the project's 2x rule).

Writes to --out: local.csv (every timing), local.md (tables + command, date, GPU),
local_check.csv (the accuracy check), local.png (local/flash vs N). --smoke runs tiny shapes on
CPU (chunked path, SDPA math anchor, wall-clock times: says nothing about speed) to test the
script's logic. Also runnable as `python -m tapa.bench.local`.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from tapa._paths import write_csv
from tapa.ops.local import dense_local_attention, local_attention

TARGET = dict(n=32768, window=256, ratio=0.15)
MAX_CHECK_ERROR = 0.05  # relative RMSE in bf16 past which the op computes another function
TENSORS = ("out", "dq", "dk", "dv")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seq-lens", type=int, nargs="+",
                        default=[4096, 8192, 16384, 32768, 65536])
    parser.add_argument("--windows", type=int, nargs="+", default=[256, 1024])
    parser.add_argument("--tokens", type=int, default=65536, help="batch * N, fixed")
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--kv-heads", type=int, default=None,
                        help="k/v heads (GQA when fewer than --heads; default: --heads)")
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--impl", choices=("flex", "chunked"), default="flex",
                        help="local_attention path to time (default flex)")
    parser.add_argument("--check-len", type=int, default=2085,
                        help="N of the accuracy check against float64 (not a block multiple)")
    parser.add_argument("--skip-checks", action="store_true")
    parser.add_argument("--out", type=Path, default=Path("results/local-h200"))
    parser.add_argument("--smoke", action="store_true",
                        help="tiny shapes on CPU (chunked path): tests the script, not speed")


def visible_pairs(n: int, window: int | None) -> int:
    """(query, key) pairs a causal layer of length n computes: full causal when window is None."""
    if window is None or window >= n:
        return n * (n + 1) // 2
    return window * (window + 1) // 2 + (n - window) * window


# ---------------------------------------------------------------------------------------------
# Accuracy


def _grads(fn, q, k, v, dout):
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    out = fn(q, k, v)
    out.backward(dout.to(out.dtype))
    return dict(out=out.detach(), dq=q.grad, dk=k.grad, dv=v.grad)


def _rel(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())


def check_accuracy(*, n, window, heads, kv_heads, head_dim, dtype, device, impl, seed=0):
    """Rows {check, tensor, local, reference, ratio}: rel. RMSE vs float64 of the local op and of
    the same-dtype dense reference, on fresh random inputs, batch 1."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v, dout = (torch.randn(shape, generator=gen).to(device, dtype) for shape in
                     ((1, n, heads, head_dim), (1, n, kv_heads, head_dim),
                      (1, n, kv_heads, head_dim), (1, n, heads, head_dim)))
    exact = _grads(lambda *a: dense_local_attention(*a, window), q.double(), k.double(),
                   v.double(), dout)
    same = _grads(lambda *a: dense_local_attention(*a, window), q, k, v, dout)
    mine = _grads(lambda *a: local_attention(*a, window, impl=impl), q, k, v, dout)
    check = (f"N={n} w={window} H={heads}/{kv_heads} D={head_dim} "
             f"{str(dtype).removeprefix('torch.')} {impl}")
    rows = []
    for name in TENSORS:
        local_err, reference_err = _rel(mine[name], exact[name]), _rel(same[name], exact[name])
        rows.append(dict(check=check, tensor=name, local=local_err, reference=reference_err,
                         ratio=local_err / reference_err))
    return rows


# ---------------------------------------------------------------------------------------------
# Timing


def _timer(smoke: bool):
    """Median ms of fn: do_bench on the GPU (grads set to None between runs), wall clock on CPU."""
    if not smoke:
        from triton.testing import do_bench

        return lambda fn, grads: do_bench(fn, grad_to_none=grads, return_mode="median")

    def wall(fn, grads, repeats=1):
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
            for t in grads:
                t.grad = None
        return statistics.median(times)

    return wall


def _sdpa_causal(backend_name, gqa):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = getattr(SDPBackend, backend_name)

    def attend(q, k, v):
        with sdpa_kernel(backend):
            out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                 v.transpose(1, 2), is_causal=True,
                                                 enable_gqa=gqa)
        return out.transpose(1, 2)

    return attend


def _implementations(windows, impl, gqa, smoke):
    impls = {f"local_w{w}": (w, lambda q, k, v, w=w: local_attention(q, k, v, w, impl=impl))
             for w in windows}
    anchors = ("MATH",) if smoke else ("FLASH_ATTENTION", "CUDNN_ATTENTION")
    names = {"MATH": "sdpa_math", "FLASH_ATTENTION": "sdpa_flash", "CUDNN_ATTENTION": "sdpa_cudnn"}
    for backend in anchors:
        impls[names[backend]] = (None, _sdpa_causal(backend, gqa))
    return impls


def _peak_mib(fn, q, k, v, dout):
    """High-water mark of one fwd+bwd above what was allocated before (MiB; CUDA only)."""
    if not q.is_cuda:
        return float("nan")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn(q, k, v).backward(dout)
    torch.cuda.synchronize()
    for t in (q, k, v):
        t.grad = None
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def time_length(n, *, batch, heads, kv_heads, head_dim, impls, timer, device, dtype):
    """{name: (fwd ms, fwd+bwd ms, peak MiB)} at one N; a backend that refuses is left out."""
    gen = torch.Generator().manual_seed(n)
    q, k, v, dout = (torch.randn(shape, generator=gen).to(device, dtype) for shape in
                     ((batch, n, heads, head_dim), (batch, n, kv_heads, head_dim),
                      (batch, n, kv_heads, head_dim), (batch, n, heads, head_dim)))
    grads = [q, k, v]
    for t in grads:
        t.requires_grad_(True)
    measured = {}
    for name, (_, fn) in impls.items():
        try:
            fn(q, k, v).backward(dout)  # compile / autotune outside the timing
            fwd = timer(lambda: fn(q, k, v), grads)
            fwd_bwd = timer(lambda: fn(q, k, v).backward(dout), grads)
            measured[name] = (fwd, fwd_bwd, _peak_mib(fn, q, k, v, dout))
        except RuntimeError as err:  # an anchor backend that refuses these shapes
            if isinstance(err, torch.OutOfMemoryError) or "CUDA error" in str(err):
                raise
            print(f"  {name} N={n}: {str(err).splitlines()[0][:200]}", file=sys.stderr)
        for t in grads:
            t.grad = None
    return measured


def timing_rows(n, measured, impls, *, batch, heads, head_dim):
    anchor = measured.get("sdpa_flash", measured.get("sdpa_math"))  # math: the CPU smoke run
    causal_pairs = visible_pairs(n, None)
    rows = []
    for name, (fwd, fwd_bwd, peak) in measured.items():
        window = impls[name][0]
        pairs = visible_pairs(n, window)
        ratio = fwd_bwd / anchor[1] if anchor else float("nan")
        ideal = pairs / causal_pairs
        rows.append(dict(n=n, batch=batch, impl=name, window=window or "", fwd_ms=fwd,
                         fwd_bwd_ms=fwd_bwd, peak_mib=peak, x_anchor=ratio, ideal=ideal,
                         x_ideal=ratio / ideal,
                         tflops=4 * batch * heads * pairs * head_dim * 3.5 / fwd_bwd / 1e9))
    return rows


# ---------------------------------------------------------------------------------------------
# Output


def target_line(rows, anchor):
    hit = [r for r in rows if r["n"] == TARGET["n"] and r["window"] == TARGET["window"]]
    if not hit:
        return (f"Target (N={TARGET['n']}, w={TARGET['window']}: local/{anchor} <= "
                f"{TARGET['ratio']}): not measured in this run.")
    ratio = hit[0]["x_anchor"]
    verdict = "met" if ratio <= TARGET["ratio"] else "NOT met"
    return (f"Target (N={TARGET['n']}, w={TARGET['window']}: local/{anchor} <= {TARGET['ratio']})"
            f": {ratio:.3f}, {verdict}.")


def markdown(rows, check_rows, header, anchor):
    lines = [header, ""]
    if check_rows:
        lines += ["## Accuracy: relative RMSE vs float64 (forward, gradients of q, k, v)", "",
                  "| check | tensor | local | same-dtype dense | ratio |", "|---|---|---|---|---|"]
        lines += [f"| {r['check']} | {r['tensor']} | {r['local']:.3e} | {r['reference']:.3e} | "
                  f"{r['ratio']:.2f}{'' if r['ratio'] <= 2 else ' (above 2x)'} |"
                  for r in check_rows]
        lines.append("")
    lines += [f"## fwd+bwd, local layer vs SDPA full causal ({anchor})", "",
              target_line(rows, anchor), "",
              f"| window | N | batch | local ms | {anchor} ms | local/{anchor} | ideal | "
              f"(local/{anchor}) / ideal | local TFLOP/s | local fwd ms | local peak MiB |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    anchor_ms = {r["n"]: r["fwd_bwd_ms"] for r in rows if r["impl"] == anchor}
    for r in sorted((r for r in rows if r["window"] != ""), key=lambda r: (r["window"], r["n"])):
        lines.append(f"| {r['window']} | {r['n']} | {r['batch']} | {r['fwd_bwd_ms']:.3f} | "
                     f"{anchor_ms.get(r['n'], float('nan')):.3f} | {r['x_anchor']:.3f} | "
                     f"{r['ideal']:.4f} | {r['x_ideal']:.2f} | {r['tflops']:.0f} | "
                     f"{r['fwd_ms']:.3f} | {r['peak_mib']:.0f} |")
    anchors = [r for r in rows if r["window"] == ""]
    if anchors:
        lines += ["", "## Anchors: SDPA full causal", "",
                  "| impl | N | batch | fwd ms | fwd+bwd ms | TFLOP/s | peak MiB |",
                  "|---|---|---|---|---|---|---|"]
        lines += [f"| {r['impl']} | {r['n']} | {r['batch']} | {r['fwd_ms']:.3f} | "
                  f"{r['fwd_bwd_ms']:.3f} | {r['tflops']:.0f} | {r['peak_mib']:.0f} |"
                  for r in sorted(anchors, key=lambda r: (r["impl"], r["n"]))]
    return "\n".join(lines) + "\n"


def _plot(rows, path, anchor):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    for window in sorted({r["window"] for r in rows if r["window"] != ""}):
        mine = sorted((r for r in rows if r["window"] == window), key=lambda r: r["n"])
        line, = ax.plot([r["n"] for r in mine], [r["x_anchor"] for r in mine], marker="o",
                        label=f"local w={window}")
        ax.plot([r["n"] for r in mine], [r["ideal"] for r in mine], linestyle="--",
                color=line.get_color(), label=f"ideal w={window} (work fraction)")
    ax.axhline(TARGET["ratio"], color="gray", linewidth=0.8, label=f"target {TARGET['ratio']}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("N (batch * N fixed)")
    ax.set_ylabel(f"fwd+bwd time / {anchor} causal")
    ax.set_title("local attention layer, lower is better")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _device_line(device) -> str:
    if device.type == "cuda":
        import triton

        return (f"- GPU: {torch.cuda.get_device_name(device)}; torch {torch.__version__}; "
                f"triton {triton.__version__}; python {platform.python_version()}")
    return (f"- CPU ({platform.processor() or 'unknown'}); torch {torch.__version__}; "
            f"python {platform.python_version()}")


def run(args) -> int:
    if not torch.cuda.is_available() and not args.smoke:
        raise SystemExit("tapa bench local needs a CUDA GPU (or --smoke to test the script on CPU)")
    kv_heads = args.kv_heads or args.heads
    if args.heads % kv_heads:
        raise SystemExit(f"--heads ({args.heads}) must be a multiple of --kv-heads ({kv_heads})")
    if args.smoke:
        device, dtype, impl = torch.device("cpu"), torch.float32, "chunked"
        seq_lens, windows, tokens = [64, 160], [8, 32], 320
        heads, kv_heads, head_dim, check_len = 4, 2, 16, 77
    else:
        device, dtype, impl = torch.device("cuda"), torch.bfloat16, args.impl
        seq_lens, windows, tokens = args.seq_lens, args.windows, args.tokens
        heads, head_dim, check_len = args.heads, args.head_dim, args.check_len
    anchor = "sdpa_math" if args.smoke else "sdpa_flash"
    argv = sys.argv[3:] if sys.argv[1:3] == ["bench", "local"] else sys.argv[1:]
    command = ("tapa bench local " + " ".join(argv)).strip()
    header = (f"# Local (sliding-window) attention layer vs full causal attention\n\n"
              f"- command: `{command}`\n"
              f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}\n"
              f"{_device_line(device)}\n"
              f"- {heads} q heads, {kv_heads} kv heads, head dim {head_dim}, "
              f"{str(dtype).removeprefix('torch.')}, batch*N = {tokens}; local path: {impl}; "
              f"times are {'wall-clock' if args.smoke else 'do_bench'} medians in ms")
    if args.smoke:
        header += "\n- SMOKE RUN on CPU: the times say nothing about speed"
    print(header, flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    check_rows = []
    if not args.skip_checks:
        check_rows = check_accuracy(n=check_len, window=windows[0], heads=heads,
                                    kv_heads=kv_heads, head_dim=head_dim, dtype=dtype,
                                    device=device, impl=impl)
        for r in check_rows:
            print(f"  {r['check']} {r['tensor']}: local {r['local']:.3e}, same-dtype dense "
                  f"{r['reference']:.3e}, ratio {r['ratio']:.2f}", flush=True)
        write_csv(args.out / "local_check.csv", check_rows)
        worst = max(r["local"] for r in check_rows)
        if worst > MAX_CHECK_ERROR:
            raise SystemExit(f"tapa bench local: relative error {worst:.3g} vs float64: the local "
                             "op computes another function; not timing")
    impls = _implementations(windows, impl, kv_heads != heads, args.smoke)
    timer = _timer(args.smoke)
    rows = []
    from tqdm import tqdm

    for n in tqdm(seq_lens, desc="N", disable=None):
        batch = max(1, tokens // n)
        measured = time_length(n, batch=batch, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                               impls=impls, timer=timer, device=device, dtype=dtype)
        new_rows = timing_rows(n, measured, impls, batch=batch, heads=heads, head_dim=head_dim)
        rows += new_rows
        for r in new_rows:
            print(f"  N={n} {r['impl']}: fwd+bwd {r['fwd_bwd_ms']:.3f} ms, x {anchor} "
                  f"{r['x_anchor']:.3f} (ideal {r['ideal']:.4f})", flush=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
        # after every length, so that a run cut short keeps what it measured
        write_csv(args.out / "local.csv", rows)
        (args.out / "local.md").write_text(markdown(rows, check_rows, header, anchor))
    _plot(rows, args.out / "local.png", anchor)
    print(markdown(rows, check_rows, header, anchor))
    print(f"wrote {args.out}/local.csv, local.md, local_check.csv, local.png")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tapa.bench.local", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
