"""`tapa bench attention`: the fused TAPA kernel against SDPA (flash, cuDNN) on one GPU.

One run checks correctness on the GPU, then times, and writes to --out:
  attention.csv (every timing), attention.md (tables + the command, date and GPU),
  attention_errors.csv (bf16 errors vs float64, kernel and same-dtype reference),
  attention_tflops.png (TFLOP/s vs N).
FLOPs: 4 * B * H * N^2 * D, halved when causal; backward 2.5x the forward (docs/design.md).
Times are triton.testing.do_bench medians. Peak memory is the fwd+bwd high-water mark above
the inputs. Also runnable as `python -m tapa.bench.attention`.

The kernels run with the config table's rows (`tapa.ops.tapa.configs`); timing other configs is the
lab's (lab/kernels/attention_variants.py, which calls the functions here with explicit configs).
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import platform
import sys
from pathlib import Path

import torch

from tapa._paths import write_csv
from tapa.ops import tapa_attention
from tapa.ops.tapa.reference import chunked_tapa_attention, naive_tapa_attention

PASSES = ("fwd", "bwd", "fwd+bwd")
FLOP_FACTOR = {"fwd": 1.0, "bwd": 2.5, "fwd+bwd": 3.5}


def first_line(err: BaseException, limit: int = 200) -> str:
    """An exception's first message line, cut to `limit` characters (its type when it has none)."""
    lines = str(err).splitlines()
    return lines[0][:limit] if lines else type(err).__name__


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seq-lens", type=int, nargs="+",
                        default=[1024, 2048, 4096, 8192, 16384, 32768, 65536])
    parser.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--causal", choices=("both", "causal", "noncausal"), default="both")
    parser.add_argument("--tokens", type=int, default=65536, help="batch * N, fixed")
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--theta", type=float, default=0.5)
    parser.add_argument("--reference-len", type=int, default=1024,
                        help="also time the chunked reference at this N (causal, largest D)")
    parser.add_argument("--check-len", type=int, default=2048,
                        help="N of the bf16 accuracy check against float64")
    parser.add_argument("--long-range-len", type=int, default=65536,
                        help="N of the long-range accuracy check (0 skips it)")
    parser.add_argument("--skip-checks", action="store_true")
    parser.add_argument("--out", type=Path, default=Path("runs/bench/attention"),
                        help="output directory (default: %(default)s)")


# ---------------------------------------------------------------------------------------------
# Accuracy


def _random(shape, dtype, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(shape, generator=gen, device="cuda", dtype=torch.float32).to(dtype)


def _outputs_and_grads(fn, q, k, v, dout, **kwargs):
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    out, lse = fn(q, k, v, return_lse=True, **kwargs)
    out.backward(dout.to(out.dtype))
    return {"out": out.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad, "lse": lse.detach()}


def _rel(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())


def tapa_kernel(configs=None):
    """The fused op as f(q, k, v, **tapa_attention's arguments): `tapa_attention(impl="triton")`,
    or with configs (a `tapa.ops.tapa.configs.KernelConfigs`) the kernels launched with that row."""
    if configs is None:
        return lambda *a, **kw: tapa_attention(*a, impl="triton", **kw)
    from tapa.ops.tapa.fused import tapa_attention_triton

    def call(q, k, v, *, theta=0.5, alpha=0.1, distance="power", phase="quadratic", causal=True,
             q_offset=0, k_offset=0, return_lse=False):
        return tapa_attention_triton(q, k, v, theta=theta, alpha=alpha, distance=distance,
                                     phase=phase, causal=causal, q_offset=q_offset,
                                     k_offset=k_offset, return_lse=return_lse, configs=configs)

    return call


def accuracy_errors(n, head_dim, *, causal, dtype=torch.bfloat16, heads=4, kv_heads=4, theta=0.5,
                    distance="power", phase="quadratic", seed=0, configs=None):
    """Relative RMSE vs float64 of the kernel and of the same-dtype chunked reference, for out,
    dq, dk, dv and lse (lse is float32 for every input dtype, so its ratio is no half-precision bar).

    configs: the kernels' row (default: the config table's for these inputs).
    """
    q = _random((1, n, heads, head_dim), dtype, seed)
    k = _random((1, n, kv_heads, head_dim), dtype, seed + 1)
    v = _random((1, n, kv_heads, head_dim), dtype, seed + 2)
    dout = _random((1, n, heads, head_dim), dtype, seed + 3)
    kw = dict(causal=causal, theta=theta, distance=distance, phase=phase)
    exact = _outputs_and_grads(naive_tapa_attention, q.double(), k.double(), v.double(), dout, **kw)
    fused = _outputs_and_grads(tapa_kernel(configs), q, k, v, dout, **kw)
    same = _outputs_and_grads(chunked_tapa_attention, q, k, v, dout, **kw)
    rows = []
    for name in ("out", "dq", "dk", "dv", "lse"):
        kernel, reference = _rel(fused[name], exact[name]), _rel(same[name], exact[name])
        rows.append(dict(check=f"N={n} D={head_dim} H={heads}/{kv_heads} causal={causal} "
                               f"{distance}/{phase} {str(dtype).removeprefix('torch.')}",
                         tensor=name, kernel=kernel, reference=reference,
                         ratio=kernel / reference))
    return rows


def long_range_errors(n, *, distance="power", dtype=torch.bfloat16, heads=2, head_dim=128,
                      rows=256, seed=0, configs=None):
    """Output error vs float64 of the first `rows` queries (keys within `rows`) and of the last
    `rows` (keys up to n away), for the kernel and the same-dtype chunked reference; causal.

    configs: the kernels' row (as in accuracy_errors)."""
    q = _random((1, n, heads, head_dim), dtype, seed)
    k = _random((1, n, heads, head_dim), dtype, seed + 1)
    v = _random((1, n, heads, head_dim), dtype, seed + 2)
    with torch.no_grad():
        fused = tapa_kernel(configs)(q, k, v, distance=distance)
        errors = {}
        for label, start in (("near", 0), ("far", n - rows)):
            q_rows = q[:, start:start + rows]
            exact = naive_tapa_attention(q_rows.double(), k.double(), v.double(),
                                         distance=distance, q_offset=start)
            same = chunked_tapa_attention(q_rows, k, v, distance=distance, q_offset=start)
            errors[f"{label}_kernel"] = _rel(fused[:, start:start + rows], exact)
            errors[f"{label}_reference"] = _rel(same, exact)
    return errors


# ---------------------------------------------------------------------------------------------
# Timing


def _anchor(backend_name):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention

    backend = getattr(SDPBackend, backend_name)

    def attend(q, k, v, causal):
        with sdpa_kernel(backend):
            out = scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                               v.transpose(1, 2), is_causal=causal)
        return out.transpose(1, 2)

    return attend


def _impls(theta):
    return {
        "tapa": lambda q, k, v, causal: tapa_attention(q, k, v, theta=theta, causal=causal,
                                                       impl="triton"),
        "sdpa_flash": _anchor("FLASH_ATTENTION"),
        "sdpa_cudnn": _anchor("CUDNN_ATTENTION"),
        "reference": lambda q, k, v, causal: chunked_tapa_attention(q, k, v, theta=theta,
                                                                    causal=causal),
    }


def _time_one(fn, q, k, v, dout, causal):
    """{pass: ms} and the fwd+bwd peak memory (MiB above the inputs) of one implementation.

    A pass that fails (e.g. configs that do not compile or fit) is NaN and is reported on
    stderr; the forward failing fails all of them (RuntimeError, as before).
    """
    from triton.testing import do_bench

    grads = [q, k, v]
    nan = float("nan")
    times = {"fwd": do_bench(lambda: fn(q, k, v, causal), return_mode="median"),
             "bwd": nan, "fwd+bwd": nan}
    peak = nan
    try:
        out = fn(q, k, v, causal)
        times["bwd"] = do_bench(lambda: out.backward(dout, retain_graph=True), grad_to_none=grads,
                                return_mode="median")
        del out
        times["fwd+bwd"] = do_bench(lambda: fn(q, k, v, causal).backward(dout), grad_to_none=grads,
                                    return_mode="median")
        for t in grads:
            t.grad = None
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fn(q, k, v, causal).backward(dout)
        torch.cuda.synchronize()
        peak = (torch.cuda.max_memory_allocated() - base) / 2**20
    except Exception as err:  # noqa: BLE001  (a backward that fails: keep the forward)
        print(f"  backward failed: {first_line(err)}",
              file=sys.stderr)
    for t in grads:
        t.grad = None
    return times, peak


def timing_rows(seq_lens, head_dims, causal_modes, tokens, heads, theta, reference_len,
                progress=True, on_case=None, extra_impls=None):
    """Rows of every (head dim, causal, N) case: TAPA, the anchors, the reference at
    reference_len, and each of extra_impls ({name: f(q, k, v, causal)}, timed after the others
    in the same case, e.g. the lab's kernel configs) with its ratio to the default kernel
    (x_tapa)."""
    from tqdm import tqdm

    impls = _impls(theta)
    cases = list(itertools.product(head_dims, causal_modes, seq_lens))
    rows = []
    for head_dim, causal, n in tqdm(cases, desc="timing", disable=not progress):
        batch = max(1, tokens // n)
        q, k, v, dout = (_random((batch, n, heads, head_dim), torch.bfloat16, seed)
                         for seed in range(4))
        for t in (q, k, v):
            t.requires_grad_(True)
        flops = 4 * batch * heads * n * n * head_dim / (2 if causal else 1)
        names = ["tapa", "sdpa_flash", "sdpa_cudnn"]
        if n == reference_len and causal and head_dim == max(head_dims):
            names.append("reference")
        measured = {}
        for name in names:
            try:
                measured[name] = _time_one(impls[name], q, k, v, dout, causal)
            except RuntimeError as err:  # an anchor backend that refuses this shape
                print(f"  {name} N={n} D={head_dim} causal={causal}: {err}".splitlines()[0],
                      file=sys.stderr)
        for name, fn in (extra_impls or {}).items():
            try:
                measured[name] = _time_one(fn, q, k, v, dout, causal)
            except Exception as err:  # noqa: BLE001  (e.g. configs that do not compile or fit)
                print(f"  {name} N={n} D={head_dim}: failed: {first_line(err)}", file=sys.stderr)
        for name, (times, peak) in measured.items():
            for pass_name in PASSES:
                ms = times[pass_name]
                row = dict(head_dim=head_dim, causal=causal, n=n, batch=batch, heads=heads,
                           impl=name, pass_=pass_name, ms=ms,
                           tflops=flops * FLOP_FACTOR[pass_name] / ms / 1e9,
                           peak_mib=peak if pass_name == "fwd+bwd" else float("nan"))
                for anchor in ("tapa", "sdpa_flash", "sdpa_cudnn"):
                    ref = measured.get(anchor)
                    row[f"x_{anchor}"] = ms / ref[0][pass_name] if ref else float("nan")
                    row[f"mem_x_{anchor}"] = (peak / ref[1] if ref and pass_name == "fwd+bwd"
                                              else float("nan"))
                rows.append(row)
        del q, k, v, dout
        torch.cuda.empty_cache()
        if on_case is not None:  # keep partial results if the run is cut short
            on_case(rows)
    return rows


# ---------------------------------------------------------------------------------------------
# Output


def long_range_cells(e):
    return (f"{e['near_kernel']:.3e} | {e['near_reference']:.3e} | {e['far_kernel']:.3e} | "
            f"{e['far_reference']:.3e} | {e['far_kernel'] / e['far_reference']:.2f}")


def markdown(rows, error_rows, long_range, header, sections=()):
    """The report: header, any further sections (markdown blocks, e.g. the lab's), the accuracy
    and long-range tables, then TAPA's timings by head dim and causal mode and the anchors'."""
    lines = [header, ""]
    for section in filter(None, sections):
        lines += [section, ""]
    if error_rows:
        lines += ["## Accuracy: relative RMSE vs float64 (same bf16 inputs)", "",
                  "| check | tensor | kernel | same-dtype reference | ratio |",
                  "|---|---|---|---|---|"]
        lines += [f"| {r['check']} | {r['tensor']} | {r['kernel']:.3e} | {r['reference']:.3e} | "
                  f"{r['ratio']:.2f} |" for r in error_rows]
        lines.append("")
    if long_range:
        lines += ["## Long range (causal, output of the first and last 256 rows)", "",
                  "| distance | D | near kernel | near reference | far kernel | far reference | far ratio |",
                  "|---|---|---|---|---|---|---|"]
        lines += [f"| {distance} | {head_dim} | {long_range_cells(e)} |"
                  for (distance, head_dim), e in long_range.items()]
        lines.append("")
    tapa_rows = [r for r in rows if r["impl"] == "tapa"]
    for head_dim, causal in sorted({(r["head_dim"], r["causal"]) for r in tapa_rows},
                                   key=lambda x: (-x[0], not x[1])):
        lines += [f"## D={head_dim}, {'causal' if causal else 'non-causal'}, bf16, batch*N fixed",
                  "", "| N | pass | TAPA ms | TFLOP/s | x SDPA flash | x SDPA cuDNN | peak MiB "
                  "| mem x flash |", "|---|---|---|---|---|---|---|---|"]
        for r in tapa_rows:
            if (r["head_dim"], r["causal"]) != (head_dim, causal):
                continue
            mem = (f"{r['peak_mib']:.0f} | {r.get('mem_x_sdpa_flash', float('nan')):.3f}"
                   if r["pass_"] == "fwd+bwd" else " | ")
            lines.append(f"| {r['n']} | {r['pass_']} | {r['ms']:.3f} | {r['tflops']:.0f} | "
                         f"{r['x_sdpa_flash']:.3f} | {r['x_sdpa_cudnn']:.3f} | {mem} |")
        lines.append("")
    others = [r for r in rows if r["impl"] != "tapa" and not r["impl"].startswith("tapa:")]
    if others:
        lines += ["## Anchors and reference", "", "| impl | D | causal | N | pass | ms | TFLOP/s "
                  "| peak MiB |", "|---|---|---|---|---|---|---|---|"]
        lines += [f"| {r['impl']} | {r['head_dim']} | {r['causal']} | {r['n']} | {r['pass_']} | "
                  f"{r['ms']:.3f} | {r['tflops']:.0f} | {r['peak_mib']:.0f} |" for r in others]
    return "\n".join(lines) + "\n"


def _plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = sorted({(r["head_dim"], r["causal"]) for r in rows}, key=lambda x: (-x[0], not x[1]))
    fig, axes = plt.subplots(2, len(groups), figsize=(4.2 * len(groups), 7), squeeze=False)
    for col, (head_dim, causal) in enumerate(groups):
        for row_index, pass_name in enumerate(("fwd", "fwd+bwd")):
            ax = axes[row_index][col]
            for impl in ("tapa", "sdpa_flash", "sdpa_cudnn"):
                points = sorted((r["n"], r["tflops"]) for r in rows if r["impl"] == impl
                                and r["pass_"] == pass_name and r["head_dim"] == head_dim
                                and r["causal"] == causal)
                if points:
                    ax.plot(*zip(*points), marker="o", label=impl)
            ax.set_xscale("log", base=2)
            ax.set_title(f"{pass_name}, D={head_dim}, {'causal' if causal else 'non-causal'}")
            ax.set_xlabel("N (batch*N fixed)")
            ax.set_ylabel("TFLOP/s")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def header(args) -> str:
    """The report's title and the run's command, date, GPU and versions."""
    import triton

    argv = sys.argv[:]
    if argv and argv[0].endswith("attention.py"):  # launched with python -m
        argv[0] = "python -m tapa.bench.attention"
    return (f"# TAPA fused attention benchmark\n\n- command: `{' '.join(argv)}`\n"
            f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}\n"
            f"- GPU: {torch.cuda.get_device_name()}; torch {torch.__version__}; "
            f"triton {triton.__version__}; python {platform.python_version()}\n"
            f"- heads {args.heads}, batch*N = {args.tokens}, theta {args.theta}, bf16; "
            f"times are do_bench medians")


CAUSAL_MODES = {"both": (True, False), "causal": (True,), "noncausal": (False,)}


def default_checks(args) -> list[dict]:
    """The bf16 float64 checks of the kernels as they ship: at each timed head dim causal and not,
    GQA with the linear variants, float16 at theta 0.75 and a ragged length, and the deterministic
    mode's path (at D=128 the dQ kernel instead of the atomic dQ)."""
    rows = []
    for head_dim, causal in ((d, c) for d in args.head_dims for c in (True, False)):
        rows += accuracy_errors(args.check_len, head_dim, causal=causal, theta=args.theta)
    rows += accuracy_errors(args.check_len, 128, causal=True, heads=8, kv_heads=2,
                            distance="linear", phase="linear", theta=args.theta)
    rows += accuracy_errors(args.check_len // 2 + 37, 128, causal=True, dtype=torch.float16,
                            theta=0.75)
    was = (torch.are_deterministic_algorithms_enabled(),
           torch.is_deterministic_algorithms_warn_only_enabled())
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        deterministic = accuracy_errors(args.check_len, 128, causal=True, theta=args.theta)
    finally:
        torch.use_deterministic_algorithms(was[0], warn_only=was[1])
    for row in deterministic:
        row["check"] += " deterministic"
    return rows + deterministic


def run(args) -> int:
    if not torch.cuda.is_available():
        raise SystemExit("tapa bench attention needs a CUDA GPU")
    head = header(args)
    print(head, flush=True)
    modes = CAUSAL_MODES[args.causal]
    error_rows, long_range = [], {}
    if not args.skip_checks:
        error_rows = default_checks(args)
        for r in error_rows:
            print(f"  {r['check']} {r['tensor']}: kernel {r['kernel']:.3e} reference "
                  f"{r['reference']:.3e} ratio {r['ratio']:.2f}", flush=True)
        if args.long_range_len:  # at every timed head dim: each has its own tiles and defaults
            for head_dim in args.head_dims:
                for distance in ("power", "linear"):
                    errors = long_range_errors(args.long_range_len, distance=distance, head_dim=head_dim)
                    long_range[(distance, head_dim)] = errors
                    print(f"  long range {distance} D={head_dim}: {errors}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    write_csv(args.out / "attention_errors.csv", error_rows)

    def write(rows):
        write_csv(args.out / "attention.csv", rows)
        (args.out / "attention.md").write_text(markdown(rows, error_rows, long_range, head))

    write([])
    rows = timing_rows(args.seq_lens, args.head_dims, modes, args.tokens, args.heads, args.theta,
                       args.reference_len, on_case=write)
    if rows:
        _plot(rows, args.out / "attention_tflops.png")
    print(markdown(rows, error_rows, long_range, head))
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tapa.bench.attention", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
