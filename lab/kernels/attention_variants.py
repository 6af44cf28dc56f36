"""Kernel configs other than the table's, checked against float64 first, then timed next to the
shipped kernels and the SDPA anchors in the same cases (`tapa bench attention`'s cases and
tables, with the configs passed explicitly to each launch).

    PYTHONPATH=src python3 -m lab.kernels.attention_variants --variants dq-kernel:dq_atomic=0 \
        [--combine-best] [--kernel-report] [tapa bench attention's options]

A variant is `LABEL:SPEC` (or a bare SPEC, its own label) with SPEC as
`lab.kernels.variants.parse_variant` reads it, e.g. `dq-kernel:dq_atomic=0` or
`big-dkdv:dkdv=64x128/8/2,dq_atomic=1`, applied to the table's GPU row at each head dim. Nothing
here changes the table.

- `precompile`: Triton compiles each variant's kernels once per process, serially, which dominates a
  short GPU call; compiling them first in several processes fills Triton's on-disk cache, and the
  timing process then only loads them. The warm-up shapes specialize like the timed ones (every
  length and stride a multiple of 16).
- `combine_best`: per group of fields (forward blocks by the forward time; backward blocks and the
  atomic dQ by the backward time; trig polynomial and far-tile series by fwd+bwd), take the
  accurate variant that beats the default by more than MIN_GAIN at the largest N, and merge them.
  `time_combination` checks and times that combination ("best") next to a second measurement of
  the default (the spread between the two default rounds is the noise).
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import replace
from pathlib import Path

import torch

from lab.kernels.variants import parse_variant, variant_configs, variant_text
from tapa._paths import write_csv
from tapa.bench import attention
from tapa.bench.attention import first_line

BAR = 1.5  # kernel error <= BAR x the same-dtype reference's (issue 13), on out and gradients
GATED = ("out", "dq", "dk", "dv")
MIN_GAIN = 0.01
# (the cos in radians is the MUFU trig's: with trig_poly, so that a combination stays one the
# kernels take)
GROUPS = ((("fwd", "fwd_long", "fwd_long_from", "fwd_split_s", "fwd_fast_scalars", "fwd_tma",
            "far_bands"), "fwd"),
          (("dkdv", "dq", "dq_atomic", "dq_transpose", "bwd_fast_scalars", "dq_split_s"), "bwd"),
          (("trig_poly", "fwd_cos_radians", "dkdv_cos_radians", "dq_cos_radians"), "fwd+bwd"),
          (("taylor_order", "taylor_tolerance"), "fwd+bwd"))
COMBINED = "best"
CELLS = (("fwd", "ms"), ("fwd", "x_tapa"), ("bwd", "ms"), ("bwd", "x_tapa"), ("fwd+bwd", "ms"),
         ("fwd+bwd", "x_tapa"), ("fwd+bwd", "x_sdpa_flash"), ("fwd+bwd", "x_sdpa_cudnn"))


def parse(items: list[str]) -> dict[str, dict]:
    """{label: KernelConfigs changes} from ['LABEL:SPEC' or 'SPEC', ...]; ValueError on a bad one
    (a spec the rows' checks refuse, at D=64 or D=128, too)."""
    variants: dict[str, dict] = {}
    for item in items:
        label, sep, spec = item.partition(":")
        if not sep:
            label, spec = item, item
        if not label or label in variants or label in (COMBINED, "default"):
            raise ValueError(f"--variants {item!r}: labels must be unique, non-empty, and neither "
                             f"{COMBINED!r} nor 'default'")
        variants[label] = parse_variant(spec)
        for head_dim in (64, 128):
            variant_configs(variants[label], head_dim)
    return variants


def variant_impl(changes: dict, theta: float):
    """f(q, k, v, causal) of the kernels with the variant's configs at q's head dim (bf16); the
    function's `changes` attribute names them."""
    def fn(q, k, v, causal):
        configs = variant_configs(changes, q.shape[-1], q.dtype)
        return attention.tapa_kernel(configs)(q, k, v, theta=theta, causal=causal)

    fn.changes = changes
    return fn


# ---------------------------------------------------------------------------------------------
# Compiling ahead, in parallel


def _compile_task(task) -> str | None:
    """Run fwd+bwd of one variant on small inputs (compiling its kernels); the error, or None."""
    changes, head_dim, modes, heads, theta = task
    try:
        configs = variant_configs(changes, head_dim)
        # the warm-up's 256 keys take configs.fwd: compile the forward's long-key tile as well
        passes = [configs] + ([replace(configs, fwd=configs.fwd_long)]
                              if configs.fwd_long != configs.fwd else [])
        for each in passes:
            for causal in modes:
                q, k, v = (torch.randn(1, 256, heads, head_dim, device="cuda",
                                       dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
                out = attention.tapa_kernel(each)(q, k, v, theta=theta, causal=causal)
                out.backward(torch.randn_like(out))
        torch.cuda.synchronize()
        return None
    except Exception as err:  # noqa: BLE001  (reported; the timing reports it again)
        return f"{type(err).__name__}: {first_line(err)}"


def precompile(variants: dict, head_dims, modes, heads: int, theta: float, jobs: int) -> None:
    """Compile the default and every variant at each head dim in `jobs` spawned processes.

    A process pool that survives a crashing worker (a compiler fault): the crash fails the
    pending tasks, reported, instead of hanging the run.
    """
    import multiprocessing
    import time
    from concurrent.futures import ProcessPoolExecutor

    tasks = {(label, head_dim): (changes, head_dim, tuple(modes), heads, theta)
             for label, changes in [("default", {}), *variants.items()] for head_dim in head_dims}
    if len(tasks) < 3:  # the default is compiled already or compiles anyway: nothing to overlap
        return
    start = time.perf_counter()
    with ProcessPoolExecutor(min(jobs, len(tasks)), mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {key: pool.submit(_compile_task, task) for key, task in tasks.items()}
        for (label, head_dim), future in futures.items():
            try:
                error = future.result()
            except Exception as err:  # noqa: BLE001  (BrokenProcessPool after a crash)
                error = f"{type(err).__name__}: {err}"
            if error:
                print(f"  precompile {label} D={head_dim}: {error}", file=sys.stderr, flush=True)
    print(f"precompiled {len(tasks)} variant x head-dim cases in {time.perf_counter() - start:.0f} s "
          f"({jobs} processes)", flush=True)


# ---------------------------------------------------------------------------------------------
# Accuracy


def accuracy_rows(variants: dict, n: int, head_dims, theta: float, heads: int = 16,
                  causal_modes=(True,)) -> list[dict]:
    """bf16, N=n, at each head dim and in each causal mode that is timed: relative errors vs
    float64 of each variant and of the reference (a variant timed non-causal is checked
    non-causal, which masks nothing; each head dim has its own default tiles).

    heads as in the timing (16, a multiple of 16), so that the kernels checked are the ones timed:
    Triton specializes integer arguments by divisibility by 16."""
    rows = []
    for label, changes in variants.items():
        for head_dim, causal in ((d, c) for d in head_dims for c in causal_modes):
            try:
                found = attention.accuracy_errors(n, head_dim, causal=causal, theta=theta,
                                                  configs=variant_configs(changes, head_dim),
                                                  heads=heads, kv_heads=heads)
            except Exception as err:  # noqa: BLE001  (a variant that does not compile: no timing trust)
                print(f"  variant {label} D={head_dim} causal={causal}: accuracy check failed: {first_line(err)}",
                      file=sys.stderr)
                found = [dict(tensor=name, kernel=math.nan, reference=math.nan, ratio=math.nan,
                              check=f"N={n} D={head_dim} causal={causal} bfloat16") for name in GATED]
            for row in found:
                row["variant"] = label
                print(f"  variant {label} D={head_dim} causal={causal} {row['tensor']}: kernel {row['kernel']:.3e} "
                      f"reference {row['reference']:.3e} ratio {row['ratio']:.2f}", flush=True)
            rows += found
    return rows


def meets_bar(error_rows: list[dict]) -> dict[str, bool]:
    """{variant label: every gated tensor within BAR} (a NaN ratio fails)."""
    verdict: dict[str, bool] = {}
    for row in error_rows:
        if "variant" in row and row["tensor"] in GATED:
            verdict[row["variant"]] = verdict.get(row["variant"], True) and row["ratio"] <= BAR
    return verdict


# ---------------------------------------------------------------------------------------------
# Combining the winners


def _ms(rows, impl, head_dim, n, pass_name, causal=True):
    for row in rows:
        if (row["impl"], row["head_dim"], row["n"], row["pass_"], row["causal"]) == (
                impl, head_dim, n, pass_name, causal) and row.get("round", 1) == 1:
            return row["ms"]
    return math.nan


def combine_best(rows: list[dict], variants: dict, accurate: dict, head_dim: int,
                 n: int) -> tuple[dict, dict]:
    """(changes, {group pass: chosen label}): see the module docstring. Variants without an
    accuracy verdict count as accurate (--skip-checks)."""
    combined, chosen = {}, {}
    for group, pass_name in GROUPS:
        best_label, best_ms = None, _ms(rows, "tapa", head_dim, n, pass_name) * (1 - MIN_GAIN)
        for label, changes in variants.items():
            if not accurate.get(label, True) or not any(field in changes for field in group):
                continue
            ms = _ms(rows, f"tapa:{label}", head_dim, n, pass_name)
            if ms < best_ms:
                best_label, best_ms = label, ms
        if best_label is not None:
            combined.update({k: v for k, v in variants[best_label].items() if k in group})
            chosen["+".join(group)] = best_label
    return combined, chosen


def time_combination(rows, variants, variant_errors, state, args, modes, on_case=None):
    """Combine, check and time COMBINED next to the default (second round), at
    --combine-head-dims; returns rows with the new ones (marked round 2) appended."""
    combined, chosen = combine_best(rows, variants, meets_bar(variant_errors),
                                    max(args.head_dims), max(args.seq_lens))
    state["combined"] = (combined, chosen)
    if not combined:
        print(f"combination: no accurate variant beats the default by {MIN_GAIN:.0%}", flush=True)
        return rows
    print(f"combination {COMBINED}: {variant_text(combined)} (from {chosen})", flush=True)
    best = {COMBINED: combined}
    state["variants"] = {**variants, **best}
    head_dims = args.combine_head_dims or args.head_dims
    if args.compile_jobs:
        precompile(best, head_dims, modes, args.heads, args.theta, args.compile_jobs)
    if not args.skip_checks:
        variant_errors += accuracy_rows(best, args.check_len, head_dims, args.theta, args.heads,
                                        modes)
    more: list[dict] = []

    def mark(new_rows):
        more[:] = [dict(row, round=2) for row in new_rows]
        if on_case is not None:
            on_case(more)

    attention.timing_rows(args.seq_lens, head_dims, modes, args.tokens, args.heads, args.theta, 0,
                          on_case=mark, extra_impls=impls(best, args.theta))
    return rows + more


# ---------------------------------------------------------------------------------------------
# Reports


def markdown(rows: list[dict], variants: dict, error_rows: list[dict], combined=None) -> str:
    """The variants' accuracy and timing tables (empty without variants)."""
    if not variants:
        return ""
    lines = ["## Kernel variants (bf16; `x default` = variant time / default kernel time in the "
             "same case and round)", ""]
    lines += [f"- `{label}`: `{variant_text(changes)}`" for label, changes in variants.items()]
    if combined is not None:
        changes, chosen = combined
        lines.append(f"- combination `{COMBINED}` from {chosen or 'nothing'} (each group's best "
                     f"accurate variant beating the default by > {MIN_GAIN:.0%})")
    errors = [r for r in error_rows if "variant" in r]
    if errors:
        verdict = meets_bar(errors)
        checks = list(dict.fromkeys(r["check"] for r in errors))
        lines += ["", f"Accuracy, {' and '.join(checks)}: kernel error / same-dtype reference "
                  f"error vs float64 (bar {BAR} on out and gradients; lse is float32 for every "
                  "dtype, so its ratio only shows how far the variant moves it). A variant meets "
                  "the bar only if it does in every check.", "",
                  "| variant | check | out | dq | dk | dv | lse | meets bar |",
                  "|---|---|---|---|---|---|---|---|"]
        for label in dict.fromkeys(r["variant"] for r in errors):
            for check in checks:
                ratios = {r["tensor"]: r["ratio"] for r in errors
                          if r["variant"] == label and r["check"] == check}
                if not ratios:
                    continue
                cells = " | ".join(f"{ratios.get(name, math.nan):.2f}" for name in (*GATED, "lse"))
                lines.append(f"| {label} | {check} | {cells} | {'yes' if verdict.get(label) else 'NO'} |")
    timed = [r for r in rows if r["impl"] == "tapa" or r["impl"].startswith("tapa:")]
    if timed:
        lines += ["", "| variant | D | causal | N | round | fwd ms | fwd x default | bwd ms | "
                  "bwd x default | fwd+bwd ms | fwd+bwd x default | fwd+bwd x flash | "
                  "fwd+bwd x cuDNN |", "|" + "---|" * 13]
        cases = dict.fromkeys((r["head_dim"], r["causal"], r["n"], r.get("round", 1)) for r in timed)
        for head_dim, causal, n, round_ in cases:
            by_impl: dict[str, dict] = {}
            for r in timed:
                if (r["head_dim"], r["causal"], r["n"], r.get("round", 1)) == (head_dim, causal, n, round_):
                    by_impl.setdefault(r["impl"], {})[r["pass_"]] = r
            order = sorted(by_impl, key=lambda impl: (impl != "tapa",
                                                      by_impl[impl].get("fwd+bwd", {}).get("ms", math.inf)))
            for impl in order:
                cells = [f"{by_impl[impl].get(pass_name, {}).get(key, math.nan):.3f}"
                         for pass_name, key in CELLS]
                name = "default" if impl == "tapa" else impl.removeprefix("tapa:")
                lines.append(f"| {name} | {head_dim} | {causal} | {n} | {round_} | "
                             + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_kernel_report(out: Path, quiet: bool = False) -> list[dict]:
    """attention_kernels.csv/.md for every kernel compiled in this process, and sass/ with the
    SASS (or PTX) of the first kernel of each kind (the default's)."""
    from lab.kernels import kernel_report
    from tapa.ops.tapa import launch

    rows = kernel_report.kernel_rows(out / "sass", launch.TRAINING_KERNELS)
    write_csv(out / "attention_kernels.csv", rows)
    (out / "attention_kernels.md").write_text(
        "# Compiled TAPA kernels: registers, spills (local bytes / 4), shared bytes, SASS census\n\n"
        + kernel_report.markdown(rows))
    if not quiet:
        print(kernel_report.markdown(rows), flush=True)
    return rows


# ---------------------------------------------------------------------------------------------
# The run


def impls(variants: dict, theta: float) -> dict:
    """{'tapa:LABEL': f(q, k, v, causal)} of each variant, for `tapa.bench.attention.timing_rows`."""
    return {f"tapa:{label}": variant_impl(changes, theta) for label, changes in variants.items()}


def first_rounds(rows):
    """The rows without a case's second round (time_combination re-times the default; the second
    round shows only in the variants table)."""
    first = {(r["head_dim"], r["causal"], r["n"]) for r in rows if r.get("round", 1) == 1}
    return [r for r in rows if r.get("round", 1) == 1 or (r["head_dim"], r["causal"], r["n"]) not in first]


def long_range_markdown(variant_long_range: dict) -> str:
    if not variant_long_range:
        return ""
    lines = ["## Long range, variants (power distance, causal, output of the first and last "
             "256 rows)", "",
             "| variant | D | near kernel | near reference | far kernel | far reference "
             "| far ratio |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {label} | {head_dim} | {attention.long_range_cells(e)} |"
              for (label, head_dim), e in variant_long_range.items()]
    return "\n".join(lines) + "\n"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    attention.add_arguments(parser)
    parser.add_argument("--variants", nargs="+", required=True, metavar="[LABEL:]SPEC",
                        help="kernel configs to check and time next to the table's, SPEC as "
                             "lab.kernels.variants.parse_variant reads it, e.g. dq-kernel:dq_atomic=0")
    parser.add_argument("--combine-best", action="store_true",
                        help="afterwards, combine the variants that beat the default (at the "
                             "largest N) and time that combination")
    parser.add_argument("--combine-head-dims", type=int, nargs="+", default=None,
                        help="head dims at which the combination is timed (default: --head-dims)")
    parser.add_argument("--compile-jobs", type=int, default=0,
                        help="compile the default and every variant first in this many processes")
    parser.add_argument("--kernel-report", action="store_true",
                        help="write attention_kernels.csv/.md (registers, spills, SASS census) "
                             "and the SASS of the default kernels")


def run(args) -> int:
    """`tapa bench attention`'s run with the variants: each checked against float64 (out and
    every gradient, and the 64k far rows) and timed in every case next to the table's kernels."""
    if not torch.cuda.is_available():
        raise SystemExit("lab.kernels.attention_variants needs a CUDA GPU")
    variants = parse(args.variants)  # a bad spec stops here, before any work
    header = attention.header(args)
    print(header, flush=True)
    modes = attention.CAUSAL_MODES[args.causal]
    if args.compile_jobs:
        precompile(variants, args.head_dims, modes, args.heads, args.theta, args.compile_jobs)
    long_range, variant_long_range = {}, {}
    if not args.skip_checks and args.long_range_len:
        for head_dim in args.head_dims:  # each head dim has its own tiles and defaults
            for distance in ("power", "linear"):
                errors = attention.long_range_errors(args.long_range_len, distance=distance,
                                                     head_dim=head_dim)
                long_range[(distance, head_dim)] = errors
                print(f"  long range {distance} D={head_dim}: {errors}", flush=True)
        for label, changes in variants.items():  # the far tiles' series is the power distance's
            for head_dim in args.head_dims:
                errors = attention.long_range_errors(args.long_range_len, head_dim=head_dim,
                                                     configs=variant_configs(changes, head_dim))
                variant_long_range[(label, head_dim)] = errors
                print(f"  long range {label} D={head_dim}: {errors}", flush=True)
    variant_errors = []
    if not args.skip_checks:
        variant_errors = accuracy_rows({"default": {}, **variants}, args.check_len, args.head_dims,
                                       args.theta, args.heads, modes)
    args.out.mkdir(parents=True, exist_ok=True)
    write_csv(args.out / "attention_errors.csv", variant_errors)
    state = dict(variants=variants, combined=None)

    def report(rows):
        variants_md = markdown(rows, state["variants"], variant_errors, state["combined"])
        return attention.markdown(first_rounds(rows), [], long_range, header,
                                  sections=(variants_md, long_range_markdown(variant_long_range)))

    def write(rows):
        write_csv(args.out / "attention.csv", rows)
        (args.out / "attention.md").write_text(report(rows))

    write([])
    rows = attention.timing_rows(args.seq_lens, args.head_dims, modes, args.tokens, args.heads,
                                 args.theta, args.reference_len, on_case=write,
                                 extra_impls=impls(variants, args.theta))
    if args.kernel_report:  # now, and again at the end: a run cut short keeps the first
        write_kernel_report(args.out, quiet=True)
    if args.combine_best:
        rows = time_combination(rows, variants, variant_errors, state, args, modes,
                                on_case=lambda more: write(rows + more))
        write(rows)
        write_csv(args.out / "attention_errors.csv", variant_errors)
    if rows:
        attention._plot([r for r in first_rounds(rows) if not r["impl"].startswith("tapa:")],
                        args.out / "attention_tflops.png")
    if args.kernel_report:
        write_kernel_report(args.out)
    print(report(rows))
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.kernels.attention_variants",
                                     description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
