"""`tapa bench local`: its arithmetic, its arguments, and the whole script through --smoke on CPU
(chunked path, SDPA math anchor; times meaningless)."""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys

import pytest
import torch

from tapa.bench import local as bench_local


@pytest.mark.parametrize("n,window", [(1, 1), (10, 1), (10, 3), (10, 10), (10, 40), (300, 37)])
def test_visible_pairs_counts_the_mask(n, window):
    distance = torch.arange(n)[:, None] - torch.arange(n)[None, :]
    visible = (distance >= 0) & (distance < window)
    assert bench_local.visible_pairs(n, window) == int(visible.sum())
    assert bench_local.visible_pairs(n, None) == int((distance >= 0).sum())


def test_target_line_verdicts():
    row = dict(n=32768, window=256, x_anchor=0.12)
    assert "0.120, met" in bench_local.target_line([row], "sdpa_flash")
    assert "NOT met" in bench_local.target_line([{**row, "x_anchor": 0.2}], "sdpa_flash")
    assert "not measured" in bench_local.target_line([{**row, "n": 4096}], "sdpa_flash")


def test_cli_arguments():
    from tapa.bench import command

    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    args = parser.parse_args(["local", "--windows", "128", "--kv-heads", "4", "--seq-lens", "8192"])
    assert args._module == "tapa.bench.local"
    assert (args.windows, args.kv_heads, args.heads, args.seq_lens) == ([128], 4, 16, [8192])
    assert (args.head_dim, args.tokens, args.impl) == (128, 65536, "flex")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU refusal")
def test_needs_cuda_without_smoke(tmp_path):
    from tapa.cli import main as tapa_main

    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        tapa_main(["bench", "local", "--out", str(tmp_path)])


def test_heads_must_divide(tmp_path):
    from tapa.cli import main as tapa_main

    with pytest.raises(SystemExit, match="multiple of --kv-heads"):
        tapa_main(["bench", "local", "--smoke", "--heads", "6", "--kv-heads", "4",
                   "--out", str(tmp_path)])


@pytest.mark.skipif(torch.cuda.is_available(), reason="the smoke run is the CPU path")
def test_smoke_run_writes_consistent_results(tmp_path):
    out = tmp_path / "out"
    result = subprocess.run([sys.executable, "-m", "tapa", "bench", "local", "--smoke", "--out",
                             str(out)], cwd=tmp_path, env=dict(os.environ), capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = list(csv.DictReader(open(out / "local.csv")))
    assert {(int(r["n"]), r["impl"]) for r in rows} == {
        (n, impl) for n in (64, 160) for impl in ("local_w8", "local_w32", "sdpa_math")}
    anchor = {int(r["n"]): float(r["fwd_bwd_ms"]) for r in rows if r["impl"] == "sdpa_math"}
    for r in rows:
        n, window = int(r["n"]), int(r["window"]) if r["window"] else None
        assert float(r["x_anchor"]) == pytest.approx(float(r["fwd_bwd_ms"]) / anchor[n])
        ideal = bench_local.visible_pairs(n, window) / bench_local.visible_pairs(n, None)
        assert float(r["ideal"]) == pytest.approx(ideal)
        assert float(r["x_ideal"]) == pytest.approx(float(r["x_anchor"]) / ideal)
        assert int(r["batch"]) == 320 // n
    checks = list(csv.DictReader(open(out / "local_check.csv")))
    assert [c["tensor"] for c in checks] == ["out", "dq", "dk", "dv"]
    assert all(float(c["local"]) < 1e-5 for c in checks)
    report = (out / "local.md").read_text()
    assert "SMOKE RUN" in report and "command: `tapa bench local --smoke" in report
    assert "4 q heads, 2 kv heads, head dim 16" in report
    assert (out / "local.png").exists()
