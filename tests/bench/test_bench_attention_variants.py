"""The CPU-side logic of `tapa bench attention --variants` and of the kernel report: parsing,
combining the winners, the tables, and the SASS/PTX census (on text; no GPU, no compiler)."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("triton")

from tapa.bench import attention, attention_variants, kernel_report  # noqa: E402
from tapa.ops.tapa.launch import KernelConfig, variant_text  # noqa: E402


def _rows(times: dict, head_dim=128, n=16384, round_=None):
    """Benchmark rows from {impl: (fwd, bwd, fwd+bwd)}, ratios to 'tapa' and a flash anchor."""
    rows = []
    for impl, values in times.items():
        for pass_name, ms in zip(attention.PASSES, values):
            row = dict(head_dim=head_dim, causal=True, n=n, impl=impl, pass_=pass_name, ms=ms,
                       tflops=1.0, peak_mib=math.nan, x_tapa=ms / times["tapa"][attention.PASSES.index(pass_name)],
                       x_sdpa_flash=ms / 10.0, x_sdpa_cudnn=ms / 5.0)
            if round_ is not None:
                row["round"] = round_
            rows.append(row)
    return rows


def test_parse_labels_and_errors():
    variants = attention_variants.parse(["atomic:dq_atomic=1", "trig_terms=4"])
    assert variants == {"atomic": {"dq_atomic": True}, "trig_terms=4": {"trig_terms": 4}}
    assert variant_text({"fwd": KernelConfig(128, 64, 8, 3), "dq_atomic": True}) == \
        "fwd=128x64/8/3,dq_atomic=1"
    for bad in (["a:dq_atomic=1", "a:trig_terms=4"], ["best:dq_atomic=1"], ["default:trig_terms=4"],
                ["x:fwd=12x64"]):
        with pytest.raises(ValueError):
            attention_variants.parse(bad)


def test_combine_best_takes_each_groups_accurate_winner():
    variants = attention_variants.parse([
        "fast-fwd:fwd=128x128/8/2", "slow-fwd:fwd=64x64/4/2", "atomic:dq_atomic=1,dkdv=64x128/8/2",
        "terms:trig_terms=4", "wrong:trig_terms=3", "taylor:taylor_order=3,taylor_tolerance=1e-7",
        "noise:dq=128x32/8/2"])
    rows = _rows({"tapa": (16.0, 70.0, 86.0), "tapa:fast-fwd": (15.0, 70.0, 85.0),
                  "tapa:slow-fwd": (17.0, 70.0, 87.0), "tapa:atomic": (16.0, 50.0, 66.0),
                  "tapa:terms": (15.5, 68.0, 83.5), "tapa:wrong": (14.0, 60.0, 74.0),
                  "tapa:taylor": (16.0, 70.0, 85.9), "tapa:noise": (16.0, 69.8, 85.8)})
    # a second round of the default must not be read as the first
    rows += _rows({"tapa": (1.0, 1.0, 1.0)}, round_=2)
    errors = [dict(variant=label, tensor=name, ratio=3.0 if label == "wrong" else 1.3)
              for label in variants for name in attention_variants.GATED]
    combined, chosen = attention_variants.combine_best(
        rows, variants, attention_variants.meets_bar(errors), 128, 16384)
    assert combined == {"fwd": KernelConfig(128, 128, 8, 2), "dq_atomic": True,
                        "dkdv": KernelConfig(64, 128, 8, 2), "trig_terms": 4}
    assert chosen == {"fwd+fwd_long+fwd_split_s+fwd_fast_scalars+fwd_row_series+fwd_ramp_series+fwd_dot_rowsum+fwd_cos_radians+fwd_tma+fwd_lazy_rescale+fwd_persistent+far_bands": "fast-fwd", "dkdv+dq+dq_atomic+dq_transpose+dkdv_reverse+dkdv_cos_radians+dq_cos_radians+bwd_fast_scalars+dq_split_s+dq_row_series+dkdv_split_s+dkdv_tma+dq_tma+bwd_bands": "atomic",
                      "trig_poly+trig_terms": "terms"}
    assert attention_variants.combine_best(rows, {}, {}, 128, 16384) == ({}, {})


def test_variants_markdown_and_main_table():
    variants = attention_variants.parse(["atomic:dq_atomic=1"])
    rows = _rows({"tapa": (16.0, 70.0, 86.0), "tapa:atomic": (16.0, 50.0, 66.0)})
    rows += _rows({"tapa": (16.1, 70.5, 86.6), "tapa:best": (16.0, 49.0, 65.0)}, round_=2)
    errors = [dict(variant="atomic", tensor=name, ratio=1.6 if name == "dq" else 1.2,
                   check="N=2048 D=128 causal=True bfloat16") for name in (*attention_variants.GATED, "lse")]
    text = attention_variants.markdown(rows, variants, errors, ({"dq_atomic": True}, {"bwd": "atomic"}))
    assert "`atomic`: `dq_atomic=1`" in text
    assert "| atomic | N=2048 D=128 causal=True bfloat16 | 1.20 | 1.60 | 1.20 | 1.20 | 1.20 | NO |" in text
    assert "| atomic | 128 | True | 16384 | 1 | 16.000 | 1.000 | 50.000 | 0.714 | 66.000 | 0.767 |" in text
    assert "| best | 128 | True | 16384 | 2 |" in text
    main = attention._markdown(rows, [], {}, "# header")
    assert main.count("| 16384 | fwd+bwd |") == 1  # the default's second round stays out of it
    assert attention_variants.markdown(rows, {}, []) == ""


SASS = """
        /*0a70*/                   MUFU.EX2 R5, R4 ;                          /* 0x0000000400057308 */
        /*0a80*/              @!P0 FFMA.FTZ R3, R2, R5, R3 ;                  /* 0x0000000502038223 */
        /*0a90*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], R24 ;
        /*0aa0*/                   STL.64 [R1+0x10], R4 ;
        /*0ab0*/               @P1 REDG.E.ADD.F32.FTZ.RN.STRONG.GPU desc[UR6][R176.64], R168 ;
        /*0ac0*/                   FFMA R7, R2, R5, R3 ;
"""

PTX = """
\t// begin inline asm
\tfma.rn.f32 \t%f3, %f1, %f2, %f3;
\t@%p1 ex2.approx.f32 \t%f4, %f3;
\twgmma.mma_async.sync.aligned.m64n64k16.f32.bf16 {%f5}, %rd1, %rd2, p, 1, 1, 0, 1;
\tmul.f32 \t%f6, %f4, %f5;
"""


def test_census_reads_sass_and_ptx():
    counts = kernel_report.sass_opcodes(SASS)
    assert counts == {"MUFU": 1, "FFMA": 2, "HGMMA": 1, "STL": 1, "REDG": 1}
    second = kernel_report.sass_instructions(SASS)[1]  # the census script's view of a line
    assert second == dict(addr=0x0A80, pred="@!P0", op="FFMA", mods=".FTZ", args="R3, R2, R5, R3")
    ptx = kernel_report.ptx_opcodes(PTX)
    assert (ptx["fma"], ptx["ex2"], ptx["wgmma"], ptx["mul"]) == (1, 1, 1, 1)
    table = kernel_report.markdown([
        dict(kernel="fwd", config="128x64/8/3", TRIG_TERMS=6, n_regs=255, n_spills=8, instructions=9,
             FFMA=2, MUFU=1),
        dict(kernel="fwd", config="128x64/8/3", TRIG_TERMS=4, n_regs=240, n_spills=0, instructions=7,
             FFMA=1, MUFU=1)])
    assert "| kernel | config | TRIG_TERMS | n_regs | n_spills |" in table
    assert "| fwd | 128x64/8/3 | 4 | 240 | 0 |" in table


def _stub_gpu(monkeypatch):
    """`attention.run`'s GPU parts replaced: timings read the configs each call runs under (wide
    forward tiles 15 ms, else 16; atomic dQ 50 ms backward, else 70), float64 checks give ratio 1.3
    (2.0 for trig_terms=3)."""
    import torch

    from tapa.ops.tapa import launch as triton_launch

    def fake_time_one(fn, q, k, v, dout, causal):
        configs = triton_launch._override
        fwd = 15.0 if configs is not None and configs.fwd.block_n == 128 else 16.0
        bwd = 50.0 if configs is not None and configs.dq_atomic else 70.0
        return {"fwd": fwd, "bwd": bwd, "fwd+bwd": fwd + bwd}, 100.0

    def fake_errors(n, head_dim, *, causal, variant=None, **kwargs):
        ratio = 2.0 if variant and variant.get("trig_terms") == 3 else 1.3
        return [dict(check=f"N={n} D={head_dim} causal={causal} bfloat16" + (f" {variant}" if variant else ""),
                     tensor=name, kernel=ratio * 1e-3, reference=1e-3, ratio=ratio)
                for name in (*attention_variants.GATED, "lse")]

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "fake GPU")
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(attention, "_random", lambda shape, dtype, seed: torch.zeros(1))
    monkeypatch.setattr(attention, "_time_one", fake_time_one)
    monkeypatch.setattr(attention, "accuracy_errors", fake_errors)
    monkeypatch.setattr(attention, "_plot", lambda rows, path: None)
    monkeypatch.setattr(attention_variants, "write_kernel_report", lambda out, quiet=False: [])


def _args(*argv):
    import argparse

    parser = argparse.ArgumentParser()
    attention.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_long_range_check_runs_at_every_head_dim(tmp_path, monkeypatch):
    """The 64k far-row check runs at each timed head dim (D=64 has its own tiles and defaults),
    and the table shows the far rows' error ratio the accuracy bar reads."""
    _stub_gpu(monkeypatch)
    calls = []

    def fake_long_range(n, *, distance, head_dim, **kwargs):
        calls.append((n, distance, head_dim))
        return dict(near_kernel=1e-3, near_reference=1e-3, far_kernel=2.8e-3 if head_dim == 64 else 1.4e-3,
                    far_reference=2e-3 if head_dim == 64 else 1e-3)

    monkeypatch.setattr(attention, "long_range_errors", fake_long_range)
    args = _args("--seq-lens", "4096", "--head-dims", "128", "64", "--causal", "causal",
                 "--long-range-len", "8192", "--reference-len", "0", "--out", str(tmp_path))
    assert attention.run(args) == 0
    assert sorted(calls) == [(8192, d, h) for d in ("linear", "power") for h in (64, 128)]
    report = (tmp_path / "attention.md").read_text()
    assert "| power | 64 | 1.000e-03 | 1.000e-03 | 2.800e-03 | 2.000e-03 | 1.40 |" in report
    assert "| linear | 128 | 1.000e-03 | 1.000e-03 | 1.400e-03 | 1.000e-03 | 1.40 |" in report
    for head_dim in (64, 128):  # so does the N=2048 float64 check, causal and not
        for causal in (True, False):
            assert f"| N=2048 D={head_dim} causal={causal} bfloat16 | dq | 1.300e-03 |" in report


def test_long_range_check_runs_for_each_variant(tmp_path, monkeypatch):
    """With variants, the far rows are checked inside each variant's configs too (the far tiles'
    series is what a taylor variant changes), at each timed head dim, and tabled per variant."""
    import torch

    from tapa.ops.tapa import launch as triton_launch

    _stub_gpu(monkeypatch)
    calls = []

    def fake_long_range(n, *, head_dim, distance="power", variant=None, **kwargs):
        if variant is None:  # the default's row, as run() calls it
            calls.append(("default", distance, head_dim))
            return dict(near_kernel=1e-3, near_reference=1e-3, far_kernel=1e-3, far_reference=1e-3)
        base = triton_launch.default_configs(head_dim, head_dim, torch.bfloat16)
        order = triton_launch.with_variant(base, variant).taylor_order
        calls.append((order, distance, head_dim))
        return dict(near_kernel=1e-3, near_reference=1e-3, far_kernel=order * 1e-3,
                    far_reference=1e-3)

    monkeypatch.setattr(attention, "long_range_errors", fake_long_range)
    args = _args("--seq-lens", "4096", "--head-dims", "128", "64", "--causal", "causal",
                 "--long-range-len", "8192", "--reference-len", "0", "--out", str(tmp_path),
                 "--variants", "t2:taylor_order=2")
    assert attention.run(args) == 0
    assert sorted(c for c in calls if c[0] == 2) == [(2, "power", 64), (2, "power", 128)]
    report = (tmp_path / "attention.md").read_text()
    assert "## Long range, variants" in report
    for head_dim in (64, 128):
        assert f"| t2 | {head_dim} | 1.000e-03 | 1.000e-03 | 2.000e-03 | 1.000e-03 | 2.00 |" in report


def test_run_wires_variants_combination_and_reports(tmp_path, monkeypatch):
    """`run` end to end on CPU with the GPU parts stubbed: each variant is timed inside its own
    configs (the stub reads them), the combination is built, checked and timed, files written."""
    _stub_gpu(monkeypatch)
    args = _args("--seq-lens", "4096", "16384", "--head-dims", "128", "--causal", "both",
                 "--long-range-len", "0", "--reference-len", "0", "--combine-best",
                 "--combine-head-dims", "64", "128", "--kernel-report", "--out", str(tmp_path),
                 "--variants", "wide:fwd=128x128/8/2", "atomic:dq_atomic=1", "low:trig_terms=3")
    assert attention.run(args) == 0
    report = (tmp_path / "attention.md").read_text()
    assert "combination `best` from {'fwd+fwd_long+fwd_split_s+fwd_fast_scalars+fwd_row_series+fwd_ramp_series+fwd_dot_rowsum+fwd_cos_radians+fwd_tma+fwd_lazy_rescale+fwd_persistent+far_bands': 'wide', 'dkdv+dq+dq_atomic+dq_transpose+dkdv_reverse+dkdv_cos_radians+dq_cos_radians+bwd_fast_scalars+dq_split_s+dq_row_series+dkdv_split_s+dkdv_tma+dq_tma+bwd_bands': 'atomic'}" in report
    # each variant is checked in each timed mode, non-causal too (it masks nothing)
    for causal in (True, False):
        check = f"N=2048 D=128 causal={causal} bfloat16"
        assert f"| low | {check} | 2.00 | 2.00 | 2.00 | 2.00 | 2.00 | NO |" in report
        assert f"| default | {check} | 1.30 | 1.30 | 1.30 | 1.30 | 1.30 | yes |" in report
        assert f"| best | {check} |" in report
        assert f"| best | N=2048 D=64 causal={causal} bfloat16 |" in report  # each combined head dim
    assert "| best | 64 | True | 16384 | 2 | 15.000 | 0.938 | 50.000 | 0.714 |" in report
    assert "| wide | 128 | True | 4096 | 1 | 15.000 | 0.938 | 70.000 | 1.000 |" in report
    errors = (tmp_path / "attention_errors.csv").read_text()
    assert ",best" in errors or "best\n" in errors


def test_every_launch_config_field_is_in_one_group():
    """`combine_best` combines a variant's fields group by group: a field in no group would never
    be combined, one in two would be taken twice."""
    from dataclasses import fields

    from tapa.ops.tapa.launch import LaunchConfigs

    grouped = [name for group, _ in attention_variants.GROUPS for name in group]
    assert sorted(grouped) == sorted(f.name for f in fields(LaunchConfigs))
