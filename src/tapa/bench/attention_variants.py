"""Kernel variants in `tapa bench attention --variants`: checked against float64 first, then timed
next to the default kernel and the SDPA anchors in the same cases.

A variant is `LABEL:SPEC` (or a bare SPEC, its own label) with SPEC as
`tapa.ops.tapa.launch.parse_variant` reads it, e.g. `dq-kernel:dq_atomic=0` or
`big-dkdv:dkdv=64x128/8/2,dq_atomic=1`. Nothing here changes a default.

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

import math
import sys
from dataclasses import replace
from pathlib import Path

import torch

from tapa._paths import write_csv
from tapa.bench.kernel_report import first_line

BAR = 1.5  # kernel error <= BAR x the same-dtype reference's (issue 13), on out and gradients
GATED = ("out", "dq", "dk", "dv")
MIN_GAIN = 0.01
GROUPS = ((("fwd", "fwd_long", "fwd_split_s", "fwd_fast_scalars", "fwd_row_series", "fwd_ramp_series",
            "fwd_dot_rowsum", "fwd_cos_radians", "fwd_tma",
            "fwd_lazy_rescale", "fwd_persistent", "far_bands"), "fwd"),
          (("dkdv", "dq", "dq_atomic", "dq_transpose", "dkdv_reverse", "dkdv_cos_radians",
            "dq_cos_radians", "bwd_fast_scalars", "dq_split_s", "dq_row_series",
            "dkdv_split_s", "dkdv_tma", "dq_tma", "bwd_bands"), "bwd"),
          (("trig_poly", "trig_terms"), "fwd+bwd"), (("taylor_order", "taylor_tolerance"), "fwd+bwd"))
COMBINED = "best"
CELLS = (("fwd", "ms"), ("fwd", "x_tapa"), ("bwd", "ms"), ("bwd", "x_tapa"), ("fwd+bwd", "ms"),
         ("fwd+bwd", "x_tapa"), ("fwd+bwd", "x_sdpa_flash"), ("fwd+bwd", "x_sdpa_cudnn"))


def parse(items: list[str]) -> dict[str, dict]:
    """{label: LaunchConfigs changes} from ['LABEL:SPEC' or 'SPEC', ...]; ValueError on a bad one."""
    from tapa.ops.tapa import launch as triton_launch

    variants: dict[str, dict] = {}
    for item in items:
        label, sep, spec = item.partition(":")
        if not sep:
            label, spec = item, item
        if not label or label in variants or label in (COMBINED, "default"):
            raise ValueError(f"--variants {item!r}: labels must be unique, non-empty, and neither "
                             f"{COMBINED!r} nor 'default'")
        variants[label] = triton_launch.parse_variant(spec)
    return variants


def variant_configs(changes: dict, head_dim: int):
    """The bf16 launch configs of a variant: the default's at head_dim with `changes` applied."""
    from tapa.ops.tapa import launch as triton_launch

    return triton_launch.with_variant(
        triton_launch.default_configs(head_dim, head_dim, torch.bfloat16), changes)


# ---------------------------------------------------------------------------------------------
# Compiling ahead, in parallel


def _compile_task(task) -> str | None:
    """Run fwd+bwd of one variant on small inputs (compiling its kernels); the error, or None."""
    changes, head_dim, modes, heads, theta = task
    try:
        from tapa.ops import tapa_attention
        from tapa.ops.tapa import launch as triton_launch

        configs = variant_configs(changes, head_dim)
        # the warm-up's 256 keys take configs.fwd: compile the forward's long-key tile as well
        passes = [configs] + ([replace(configs, fwd=configs.fwd_long, fwd_long=None)]
                              if configs.fwd_long is not None else [])
        for each in passes:
            with triton_launch.override_configs(each):
                for causal in modes:
                    q, k, v = (torch.randn(1, 256, heads, head_dim, device="cuda",
                                           dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
                    out = tapa_attention(q, k, v, theta=theta, causal=causal, impl="triton")
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
    from tapa.bench.attention import accuracy_errors

    rows = []
    for label, changes in variants.items():
        for head_dim, causal in ((d, c) for d in head_dims for c in causal_modes):
            try:
                found = accuracy_errors(n, head_dim, causal=causal, theta=theta, variant=changes,
                                        heads=heads, kv_heads=heads)
            except Exception as err:  # noqa: BLE001  (a variant that does not compile: no timing trust)
                print(f"  variant {label} D={head_dim} causal={causal}: accuracy check failed: {first_line(err)}",
                      file=sys.stderr)
                found = [dict(tensor=name, kernel=math.nan, reference=math.nan, ratio=math.nan,
                              check=f"N={n} D={head_dim} causal={causal} bfloat16") for name in GATED]
            for row in found:
                row["check"] = row["check"].split(" {")[0]
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
    from tapa.bench.attention import timing_rows

    from tapa.ops.tapa.launch import variant_text

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

    timing_rows(args.seq_lens, head_dims, modes, args.tokens, args.heads, args.theta, 0,
                on_case=mark, variants=best)
    return rows + more


# ---------------------------------------------------------------------------------------------
# Reports


def markdown(rows: list[dict], variants: dict, error_rows: list[dict], combined=None) -> str:
    """The variants' accuracy and timing tables (empty without variants)."""
    if not variants:
        return ""
    from tapa.ops.tapa.launch import variant_text

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
    from tapa.bench import kernel_report
    from tapa.ops.tapa import launch as triton_launch

    rows = kernel_report.kernel_rows(out / "sass", triton_launch.TRAINING_KERNELS)
    write_csv(out / "attention_kernels.csv", rows)
    (out / "attention_kernels.md").write_text(
        "# Compiled TAPA kernels: registers, spills (local bytes / 4), shared bytes, SASS census\n\n"
        + kernel_report.markdown(rows))
    if not quiet:
        print(kernel_report.markdown(rows), flush=True)
    return rows
