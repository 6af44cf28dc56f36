"""`tapa bench decode --smoke`: the benchmark's logic on CPU (Triton interpreter; times meaningless).

Runs the command in a fresh process: the interpreter must be chosen before triton's first import.
"""

from __future__ import annotations

import csv
import importlib.util
import os
import subprocess
import sys

import pytest
import torch

# find_spec, not an import: importing triton here would fix it to compiled mode for later tests
pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")


def _tapa(*args, cwd):
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    return subprocess.run([sys.executable, "-m", "tapa", "bench", "decode", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the smoke run is the CPU path")
def test_decode_bench_smoke_writes_results(tmp_path):
    result = _tapa("--smoke", "--splits", "1", "2", "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    out = tmp_path / "out"
    sweep = (out / "decode_splits.md").read_text()
    assert sum(line.startswith(("| 1 | ", "| 2 | ")) for line in sweep.splitlines()) == 4
    rows = list(csv.DictReader(open(out / "decode.csv")))
    assert [(int(r["batch"]), int(r["cache"])) for r in rows] == [(1, 48), (1, 96), (2, 48), (2, 96)]
    for row in rows:
        best = float(row[f"sdpa_{row['best_sdpa']}_ms"])
        assert float(row["ratio"]) == pytest.approx(float(row["tapa_ms"]) / best)
        assert float(row["tapa_first_ms"]) > 0
    report = (out / "decode.md").read_text()
    firsts = sorted(float(r["tapa_first_ms"]) for r in rows)
    slowest = max(rows, key=lambda r: float(r["tapa_first_ms"]))
    assert (f"median {(firsts[1] + firsts[2]) / 2:.1f} ms, most {firsts[-1]:.1f} ms at batch "
            f"{slowest['batch']}, cache {slowest['cache']}.") in report
    assert "SMOKE RUN" in report and "command: `tapa bench decode --smoke" in report
    assert "4 q heads, 2 kv heads, head dim 32" in report
    assert "No autotuning ran in the timed shapes" in report  # the interpreter runs one fixed tile
    assert not (out / "decode_tiles.csv").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU refusal")
def test_decode_bench_needs_cuda_without_smoke(tmp_path):
    from tapa.cli import main as tapa_main

    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        tapa_main(["bench", "decode", "--out", str(tmp_path)])


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU path of the profile")
def test_profile_step_writes_the_floor_report(tmp_path):
    """The decode-step profile on tiny shapes through the interpreter: every section is written."""
    from tapa.bench import decode as bench
    from tapa.ops.tapa import decode_kernel

    result = bench.profile_step(decode_kernel, bench._timer(True), batch=1, cache=40, heads=2, kv_heads=1,
                                head_dim=16, theta=0.5, dtype=torch.float16, device=torch.device("cpu"),
                                smoke=True)
    assert result["graph_ms"] is None and set(result["splits_ms"]) == {1, 2}
    assert result["host_ms"] > 0 and result["sdpa_host_ms"] > 0 and all(v > 0 for v in result["pieces_ms"].values())
    bench.write_profile(tmp_path, result, sdpa={"sdpa_math": 0.5}, command="test", device_name="CPU")
    report = (tmp_path / "decode_profile.md").read_text()
    for part in ("host time per call", f"SDPA's host time per call (torch's choice of backend, the same tensors) | "
                 f"{result['sdpa_host_ms']:.4f} |", "CUDA-graph replay of the step | n/a", "best SDPA (math) | 0.5000",
                 "GPU kernels", "| 1 |", "Profiler, top CPU ops"):
        assert part in report, part
    assert "tapa_decode_attention" in (tmp_path / "decode_profile_cprofile.txt").read_text()


def test_graph_columns_compare_replays_with_replays(tmp_path):
    """--graphs: TAPA's graph replay against the fastest SDPA replay (never an eager time), and
    n/a where a side was not captured; decode.md shows both tables."""
    from tapa.bench import decode as bench

    graph_times = {"tapa": 0.018, "sdpa_flash": 0.012, "sdpa_auto": 0.015}  # eager: 0.12, 0.02, 0.017
    columns = bench.graph_columns(graph_times)
    assert columns["best_sdpa_graph"] == "flash" and columns["graph_ratio"] == pytest.approx(1.5)
    assert bench.graph_columns({"sdpa_auto": 0.02})["graph_ratio"] is None
    assert bench.graph_columns({"tapa": 0.1})["graph_ratio"] is None
    rows = [{"batch": 1, "cache": 4096, "tapa_ms": 0.12, "sdpa_auto_ms": 0.017, "best_sdpa": "auto",
             "ratio": 0.12 / 0.017, "tapa_gbps": 100.0, "tapa_first_ms": 900.0, **columns},
            {"batch": 8, "cache": 4096, "tapa_ms": 0.2, "sdpa_auto_ms": 0.05, "best_sdpa": "auto",
             "ratio": 4.0, "tapa_gbps": 200.0, "tapa_first_ms": 40.0, **bench.graph_columns({})}]
    bench.write_results(tmp_path, rows, errors={"kernel": 1e-3, "reference": 1e-3}, command="test",
                        device_name="test", smoke=False, shapes=dict(heads=4, kv_heads=2, head_dim=32),
                        dtype=torch.bfloat16)
    report = (tmp_path / "decode.md").read_text()
    assert "| 1 | 4096 | 0.0180 | flash | 0.0120 | 1.50 |" in report
    assert "| 8 | 4096 | n/a | n/a | n/a | n/a (no capture) |" in report
    assert "As graphs: 0 of 1 captured shapes within 1.2x." in report
    assert "graph_ratio" in open(tmp_path / "decode.csv").readline()
    assert "| 100 | 900.0 |" in report
    assert "median 470.0 ms, most 900.0 ms at batch 1, cache 4096." in report


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU path of the split sweep")
def test_split_sweep_times_each_effective_count_once(tmp_path):
    """--splits: each requested count as the kernel runs it (whole 16-key blocks per split on the
    interpreter: 2 -> 64 keys -> 2 splits, 3 -> 48 -> 3, 50 -> 16 -> 7 of a 100-slot cache), each
    once, next to the default (CPU: 4 "SMs", 16 programs over 2 sequences -> 8 -> 16 keys -> 7
    splits, the same as 50's)."""
    from tapa.bench import decode as bench
    from tapa.ops.tapa import decode_kernel

    sweep = bench.split_sweep(decode_kernel, bench._timer(True), batch=2, cache=100, heads=2, kv_heads=1,
                              head_dim=16, theta=0.5, dtype=torch.float16, device=torch.device("cpu"),
                              splits=[1, 2, 3, 50, 2], graphs=True)
    assert sweep["default"] == 7 and sweep["mode"] == "eager"
    assert sorted(sweep["times"]) == [1, 2, 3, 7] and all(ms > 0 for ms in sweep["times"].values())
    bench.write_splits(tmp_path, [{"batch": 2, "cache": 100, **sweep}], command="test", device_name="CPU",
                       smoke=True)
    rows = list(csv.DictReader(open(tmp_path / "decode_splits.csv")))
    assert [r["splits"] for r in rows if r["default"] == "True"] == ["7"] and len(rows) == 4
    report = (tmp_path / "decode_splits.md").read_text()
    assert "| 2 | 100 | eager | 7 |" in report and "SMOKE RUN" in report


def test_splits_must_be_positive(tmp_path):
    from tapa.cli import main as tapa_main

    with pytest.raises(SystemExit, match="--splits takes positive numbers"):
        tapa_main(["bench", "decode", "--smoke", "--splits", "0", "--out", str(tmp_path)])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_split_sweep_with_a_failed_capture_times_every_count_eagerly(monkeypatch):
    """One split count whose graph capture fails: the sweep does not put its eager time among the
    others' graph replays (nor call them all graph); every count is timed eagerly."""
    from tapa.bench import decode as bench
    from tapa.ops.tapa import decode_kernel

    real, calls = bench._graph_ms, []

    def fail_second(step, timer):
        calls.append(step)
        return None if len(calls) == 2 else real(step, timer)

    monkeypatch.setattr(bench, "_graph_ms", fail_second)
    sweep = bench.split_sweep(decode_kernel, bench._timer(False), batch=2, cache=4096, heads=8, kv_heads=2,
                              head_dim=128, theta=0.5, dtype=torch.bfloat16, device=torch.device("cuda"),
                              splits=[1, 2, 4], graphs=True)
    assert len(calls) == len(sweep["times"]) >= 3 and sweep["mode"] == "eager"
    assert all(ms > 0 for ms in sweep["times"].values())


def test_tile_section_says_what_tuning_buys(tmp_path):
    """decode_tiles.csv and decode.md's autotuning table: each tile over the picked one per tuned
    shape, each tile's worst ratio, and the best fixed tile."""
    from tapa.bench import decode as bench

    tiles = (bench.tile_rows(1, 4096, [{"key": (1,), "best": "64x4",
                                        "tiles_ms": {"128x8": 0.03, "32x4": 0.02, "64x4": 0.01}}])
             + bench.tile_rows(8, 4096, []) + bench.tile_rows(8, 8192, [{"key": (2,), "best": "128x8",
                                        "tiles_ms": {"32x4": 0.05, "64x4": 0.06, "128x8": 0.04}}]))
    rows = [{"batch": b, "cache": c, "tapa_ms": 0.1, "sdpa_auto_ms": 0.1, "best_sdpa": "auto", "ratio": 1.0,
             "tapa_gbps": 1.0, "tapa_first_ms": 1.0} for b, c in ((1, 4096), (8, 4096), (8, 8192))]
    bench.write_results(tmp_path, rows, errors={"kernel": 1e-3, "reference": 1e-3}, command="test",
                        device_name="test", smoke=False, shapes=dict(heads=4, kv_heads=2, head_dim=32),
                        dtype=torch.bfloat16, tiles=tiles)
    report = (tmp_path / "decode.md").read_text()
    assert "(2 of the shapes' first calls tuned a new bucket)" in report
    assert "| batch | cache | picked | 32x4 | 64x4 | 128x8 |" in report
    assert "| 1 | 4096 | 64x4 | 2.00 | 1.00 | 3.00 |" in report
    assert "| 8 | 8192 | 128x8 | 1.25 | 1.50 | 1.00 |" in report
    assert ("Worst over the tuned shapes: 32x4 2.00x, 64x4 1.50x, 128x8 3.00x. The best fixed tile, 64x4, "
            "is at most 1.50x the tuned choice.") in report
    csv_rows = list(csv.DictReader(open(tmp_path / "decode_tiles.csv")))
    assert [(r["batch"], r["cache"], r["picked"]) for r in csv_rows] == [("1", "4096", "64x4"),
                                                                          ("8", "8192", "128x8")]
    assert float(csv_rows[1]["tile_64x4_ms"]) == pytest.approx(0.06)

    bench.write_results(tmp_path / "none", rows, errors={"kernel": 1e-3, "reference": 1e-3}, command="test",
                        device_name="test", smoke=False, shapes=dict(heads=4, kv_heads=2, head_dim=32),
                        dtype=torch.bfloat16)
    assert "No autotuning ran in the timed shapes" in (tmp_path / "none" / "decode.md").read_text()
    assert not (tmp_path / "none" / "decode_tiles.csv").exists()
