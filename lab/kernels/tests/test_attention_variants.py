"""The CPU-side logic of the lab's kernel-config timing (lab.kernels.attention_variants) and of the
kernel report: parsing, combining the winners, the tables, and the SASS/PTX census (on text; no
GPU, no compiler)."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("triton")

import torch  # noqa: E402

from lab.kernels import attention_variants, kernel_report  # noqa: E402
from lab.kernels.variants import parse_variant, variant_configs, variant_text, with_variant  # noqa: E402
from tapa.bench import attention  # noqa: E402
from tapa.ops.tapa import configs as table  # noqa: E402
from tapa.ops.tapa.configs import Tile  # noqa: E402


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


def test_parse_variant_round_trip_and_errors():
    spec = ("fwd=128x64/8/3,dkdv=64x128/8/2,dq=128x32,dq_atomic=1,taylor_order=3,"
            "taylor_tolerance=1e-07,dq_transpose=1,fwd_split_s=1,fwd_long_from=4096")
    base = table.lookup("cuda", torch.bfloat16, 128)
    configs = with_variant(base, spec)
    assert configs.fwd == configs.fwd_long == Tile(128, 64, 8, 3)  # fwd alone: every key length
    assert configs.dq == Tile(128, 32, 4, 2)
    assert (configs.dq_atomic, configs.trig_poly, configs.taylor_order) == (True, False, 3)
    assert (configs.taylor_tolerance, configs.fwd_split_s, configs.fwd_long_from) == (1e-7, 1, 4096)
    for row in set(table.TABLE.values()):  # a row's description rebuilds it from any row
        assert with_variant(table.INTERPRETER, row.describe()) == row
    assert with_variant(base, "") == base
    capped = with_variant(base, "fwd=64x64/4/2/r168,fwd_long=128x64/8/3")
    assert capped.fwd == Tile(64, 64, 4, 2, 168) and capped.fwd_long.max_registers == 0
    assert parse_variant(variant_text(parse_variant(spec))) == parse_variant(spec)
    for bad, name in (("fwd=128x48", "power of two"), ("fwd_long=64x48", "fwd_long.*power of two"),
                      ("dq_atomic=yes", "dq_atomic"), ("dq_transpose=2", "dq_transpose"),
                      ("taylor_order=x", "taylor_order"), ("blocks=1", "key=value"),
                      ("fwd=128", "BMxBN"), ("fwd=64x64/4/2/r7", "max_registers"),
                      ("fwd=64x64/4/2/r256", "max_registers"), ("fwd=64x64/4/2/r16x", "register cap"),
                      ("fwd=64x64/r168/4", "BMxBN"), ("trig_terms=4", "key=value")):
        with pytest.raises(ValueError, match=name):
            with_variant(base, bad)
    with pytest.raises(ValueError, match="taylor_order must be 1..6"):
        with_variant(base, "taylor_order=7")  # the row's own checks
    assert variant_configs({}, 64) == table.lookup("cuda", torch.bfloat16, 64)


def test_parse_labels_and_errors():
    variants = attention_variants.parse(["atomic:dq_atomic=1", "taylor_tolerance=1e-6"])
    assert variants == {"atomic": {"dq_atomic": True}, "taylor_tolerance=1e-6": {"taylor_tolerance": 1e-6}}
    assert variant_text({"fwd": Tile(128, 64, 8, 3), "dq_atomic": True}) == "fwd=128x64/8/3,dq_atomic=1"
    for bad in (["a:dq_atomic=1", "a:taylor_order=2"], ["best:dq_atomic=1"], ["default:taylor_order=2"],
                ["x:fwd=12x64"], ["x:dq_transpose=1,dq_atomic=0"],
                ["x:taylor_order=3"]):  # the last two: refused by the D=128 and D=64 rows
        with pytest.raises(ValueError):
            attention_variants.parse(bad)


def test_combine_best_takes_each_groups_accurate_winner():
    variants = attention_variants.parse([
        "fast-fwd:fwd=128x128/8/2", "slow-fwd:fwd=64x64/4/2", "atomic:dq_atomic=1,dkdv=64x128/8/2",
        "poly:trig_poly=1,fwd_cos_radians=0,dkdv_cos_radians=0,dq_cos_radians=0",
        "wrong:far_bands=0,taylor_order=1", "taylor:far_bands=0,taylor_order=1,taylor_tolerance=1e-6",
        "noise:dq=128x32/8/2"])
    rows = _rows({"tapa": (16.0, 70.0, 86.0), "tapa:fast-fwd": (15.0, 70.0, 85.0),
                  "tapa:slow-fwd": (17.0, 70.0, 87.0), "tapa:atomic": (16.0, 50.0, 66.0),
                  "tapa:poly": (15.5, 68.0, 83.5), "tapa:wrong": (14.0, 60.0, 74.0),
                  "tapa:taylor": (16.0, 70.0, 85.9), "tapa:noise": (16.0, 69.8, 85.8)})
    # a second round of the default must not be read as the first
    rows += _rows({"tapa": (1.0, 1.0, 1.0)}, round_=2)
    errors = [dict(variant=label, tensor=name, ratio=3.0 if label == "wrong" else 1.3)
              for label in variants for name in attention_variants.GATED]
    combined, chosen = attention_variants.combine_best(
        rows, variants, attention_variants.meets_bar(errors), 128, 16384)
    assert combined == {"fwd": Tile(128, 128, 8, 2), "dq_atomic": True, "dkdv": Tile(64, 128, 8, 2),
                        "trig_poly": True, "fwd_cos_radians": False, "dkdv_cos_radians": False,
                        "dq_cos_radians": False}
    fwd, bwd, trig, _ = ("+".join(group) for group, _ in attention_variants.GROUPS)
    assert chosen == {fwd: "fast-fwd", bwd: "atomic", trig: "poly"}
    assert attention_variants.combine_best(rows, {}, {}, 128, 16384) == ({}, {})


def test_every_config_field_is_in_one_group():
    """`combine_best` combines a variant's fields group by group: a field in no group would never
    be combined, one in two would be taken twice."""
    from dataclasses import fields

    grouped = [name for group, _ in attention_variants.GROUPS for name in group]
    assert sorted(grouped) == sorted(f.name for f in fields(table.KernelConfigs))


def test_variants_markdown_and_main_table():
    variants = attention_variants.parse(["atomic:dq_atomic=1"])
    rows = _rows({"tapa": (16.0, 70.0, 86.0), "tapa:atomic": (16.0, 50.0, 66.0)})
    rows += _rows({"tapa": (16.1, 70.5, 86.6), "tapa:best": (16.0, 49.0, 65.0)}, round_=2)
    errors = [dict(variant="atomic", tensor=name, ratio=1.6 if name == "dq" else 1.2,
                   check="N=2048 D=128 H=16/16 causal=True power/quadratic bfloat16")
              for name in (*attention_variants.GATED, "lse")]
    text = attention_variants.markdown(rows, variants, errors, ({"dq_atomic": True}, {"bwd": "atomic"}))
    assert "`atomic`: `dq_atomic=1`" in text
    assert ("| atomic | N=2048 D=128 H=16/16 causal=True power/quadratic bfloat16 | 1.20 | 1.60 | "
            "1.20 | 1.20 | 1.20 | NO |") in text
    assert "| atomic | 128 | True | 16384 | 1 | 16.000 | 1.000 | 50.000 | 0.714 | 66.000 | 0.767 |" in text
    assert "| best | 128 | True | 16384 | 2 |" in text
    main = attention.markdown(attention_variants.first_rounds(rows), [], {}, "# header")
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
    table_md = kernel_report.markdown([
        dict(kernel="fwd", config="128x64/8/3", TAYLOR_ORDER=6, n_regs=255, n_spills=8, instructions=9,
             FFMA=2, MUFU=1),
        dict(kernel="fwd", config="128x64/8/3", TAYLOR_ORDER=2, n_regs=240, n_spills=0, instructions=7,
             FFMA=1, MUFU=1)])
    assert "| kernel | config | TAYLOR_ORDER | n_regs | n_spills |" in table_md
    assert "| fwd | 128x64/8/3 | 2 | 240 | 0 |" in table_md


def _stub_gpu(monkeypatch):
    """The run's GPU parts replaced: timings read the configs each call runs under (wide forward
    tiles 15 ms, else 16; atomic dQ off 70 ms backward, else 50 as the D=128 row), float64 checks
    give ratio 1.3 (2.0 for taylor_order=1)."""
    def fake_time_one(fn, q, k, v, dout, causal):
        changes = getattr(fn, "changes", {})
        fwd = 15.0 if "fwd" in changes and changes["fwd"].block_n == 128 else 16.0
        bwd = 70.0 if changes.get("dq_atomic") is False else 50.0
        return {"fwd": fwd, "bwd": bwd, "fwd+bwd": fwd + bwd}, 100.0

    def fake_errors(n, head_dim, *, causal, configs=None, **kwargs):
        ratio = 2.0 if configs is not None and configs.taylor_order == 1 else 1.3
        return [dict(check=f"N={n} D={head_dim} causal={causal} bfloat16", tensor=name,
                     kernel=ratio * 1e-3, reference=1e-3, ratio=ratio)
                for name in (*attention_variants.GATED, "lse")]

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "fake GPU")
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(attention, "_random", lambda shape, dtype, seed: torch.zeros(1))
    monkeypatch.setattr(attention, "_time_one", fake_time_one)
    monkeypatch.setattr(attention, "accuracy_errors", fake_errors)
    monkeypatch.setattr(attention, "_plot", lambda rows, path: None)
    monkeypatch.setattr(attention_variants, "write_kernel_report", lambda out, quiet=False: [])


def _args(module, *argv):
    import argparse

    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_long_range_check_runs_at_every_head_dim(tmp_path, monkeypatch):
    """`tapa bench attention`: the 64k far-row check runs at each timed head dim (D=64 has its own
    tiles and defaults), and the table shows the far rows' error ratio the accuracy bar reads."""
    _stub_gpu(monkeypatch)
    calls = []

    def fake_long_range(n, *, distance, head_dim, **kwargs):
        calls.append((n, distance, head_dim))
        return dict(near_kernel=1e-3, near_reference=1e-3, far_kernel=2.8e-3 if head_dim == 64 else 1.4e-3,
                    far_reference=2e-3 if head_dim == 64 else 1e-3)

    monkeypatch.setattr(attention, "long_range_errors", fake_long_range)
    args = _args(attention, "--seq-lens", "4096", "--head-dims", "128", "64", "--causal", "causal",
                 "--long-range-len", "8192", "--reference-len", "0", "--out", str(tmp_path))
    assert attention.run(args) == 0
    assert sorted(calls) == [(8192, d, h) for d in ("linear", "power") for h in (64, 128)]
    report = (tmp_path / "attention.md").read_text()
    assert "| power | 64 | 1.000e-03 | 1.000e-03 | 2.800e-03 | 2.000e-03 | 1.40 |" in report
    assert "| linear | 128 | 1.000e-03 | 1.000e-03 | 1.400e-03 | 1.000e-03 | 1.40 |" in report
    for head_dim in (64, 128):  # so does the N=2048 float64 check, causal and not
        for causal in (True, False):
            assert f"| N=2048 D={head_dim} causal={causal} bfloat16 | dq | 1.300e-03 |" in report
    assert "| N=2048 D=128 causal=True bfloat16 deterministic | dq |" in report


def test_long_range_check_runs_for_each_variant(tmp_path, monkeypatch):
    """With variants, the far rows are checked with each variant's configs too (the far tiles'
    series is what a taylor variant changes), at each timed head dim, and tabled per variant."""
    _stub_gpu(monkeypatch)
    calls = []

    def fake_long_range(n, *, head_dim, distance="power", configs=None, **kwargs):
        order = configs.taylor_order if configs is not None else 0
        calls.append((order, distance, head_dim))
        return dict(near_kernel=1e-3, near_reference=1e-3, far_kernel=max(order, 1) * 1e-3,
                    far_reference=1e-3)

    monkeypatch.setattr(attention, "long_range_errors", fake_long_range)
    args = _args(attention_variants, "--seq-lens", "4096", "--head-dims", "128", "64", "--causal",
                 "causal", "--long-range-len", "8192", "--reference-len", "0", "--out", str(tmp_path),
                 "--variants", "t3:far_bands=0,taylor_order=3")
    assert attention_variants.run(args) == 0
    assert sorted(c for c in calls if c[0] == 3) == [(3, "power", 64), (3, "power", 128)]
    report = (tmp_path / "attention.md").read_text()
    assert "## Long range, variants" in report
    for head_dim in (64, 128):
        assert f"| t3 | {head_dim} | 1.000e-03 | 1.000e-03 | 3.000e-03 | 1.000e-03 | 3.00 |" in report


def test_run_wires_variants_combination_and_reports(tmp_path, monkeypatch):
    """The run end to end on CPU with the GPU parts stubbed: each variant is timed with its own
    configs (the stub reads them), the combination is built, checked and timed, files written."""
    _stub_gpu(monkeypatch)
    args = _args(attention_variants, "--seq-lens", "4096", "16384", "--head-dims", "128",
                 "--causal", "both", "--long-range-len", "0", "--reference-len", "0",
                 "--combine-best", "--combine-head-dims", "64", "128", "--kernel-report",
                 "--out", str(tmp_path), "--variants", "wide:fwd=128x128/8/2",
                 "kernel:dq_atomic=0,dq_transpose=0", "low:taylor_order=1,far_bands=0")
    assert attention_variants.run(args) == 0
    report = (tmp_path / "attention.md").read_text()
    fwd = "+".join(attention_variants.GROUPS[0][0])
    assert f"combination `best` from {{'{fwd}': 'wide'}}" in report
    # each variant is checked in each timed mode, non-causal too (it masks nothing)
    for causal in (True, False):
        check = f"N=2048 D=128 causal={causal} bfloat16"
        assert f"| low | {check} | 2.00 | 2.00 | 2.00 | 2.00 | 2.00 | NO |" in report
        assert f"| default | {check} | 1.30 | 1.30 | 1.30 | 1.30 | 1.30 | yes |" in report
        assert f"| best | {check} |" in report
        assert f"| best | N=2048 D=64 causal={causal} bfloat16 |" in report  # each combined head dim
    assert "| best | 64 | True | 16384 | 2 | 15.000 | 0.938 | 50.000 | 1.000 |" in report
    assert "| kernel | 128 | True | 4096 | 1 | 16.000 | 1.000 | 70.000 | 1.400 |" in report
    errors = (tmp_path / "attention_errors.csv").read_text()
    assert ",best" in errors or "best\n" in errors
