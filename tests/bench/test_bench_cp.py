"""`tapa bench cp`: under torchrun with 2 CPU processes (gloo) it measures CP 2 and CP 1 and writes
them, on plain rows and on packed documents (--doc-mask); its argument errors are one clear line; --find-longest's doubling stops at the first out of
memory and names the longest row that trained (a stand-in measure raises it: a CPU has no GPU
memory to run out of)."""

import argparse
import csv
import os
import subprocess
import sys

import pytest
import torch

from tapa.bench import cp as bench_cp
from tapa.cli import main

# gloo on CPU now and then aborts a torchrun at exit with this (tests/train/trainkit.py)
TORCHRUN_ABORT = "terminate called without an active exception"


def _torchrun(args: list[str]) -> subprocess.CompletedProcess:
    """`tapa bench cp ARGS` under torchrun, 2 CPU processes of one thread; one retry on gloo's
    abort at exit."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               "-m", "tapa.cli", "bench", "cp", "--cpu-smoke", *args]
    for _ in range(2):
        result = subprocess.run(command, env={**os.environ, "OMP_NUM_THREADS": "1"},
                                capture_output=True, text=True, timeout=120)
        if result.returncode == 0 or TORCHRUN_ABORT not in result.stderr:
            return result
    return result


# one torchrun of 2 processes, 4 configs: ~10 s on 2 cores
def test_two_processes_measure_cp2_against_cp1(tmp_path):
    out = tmp_path / "cp.csv"
    result = _torchrun(["--lengths", "32", "--warmup", "1", "--steps", "1", "--csv", str(out)])
    assert result.returncode == 0, result.stderr[-5000:]
    rows = list(csv.DictReader(open(out)))
    hybrid = "TAPA hybrid (LLLG, w256)"
    # the largest CP size first; the default sizes are the number of processes and 1
    assert [(r["pe"], r["cp"], r["rows"]) for r in rows] == [
        (hybrid, "2", "1"), (hybrid, "1", "2"), ("RoPE", "2", "1"), ("RoPE", "1", "2")]
    for row in rows:
        assert (row["seq_len"], row["processes"], row["checkpointing"]) == ("32", "2", "True")
        assert float(row["tokens_per_s"]) > 0 and float(row["step_ms"]) > 0
        assert float(row["tokens_per_s_per_gpu"]) == pytest.approx(float(row["tokens_per_s"]) / 2, abs=0.1)
        assert row["peak_mem_gib"] == "n/a" and row["mem_vs_cp1"] == "n/a"
        cp1 = next(r for r in rows if r["pe"] == row["pe"] and r["cp"] == "1")
        assert float(row["tokens_per_gpu_vs_cp1"]) == pytest.approx(
            float(row["tokens_per_s_per_gpu"]) / float(cp1["tokens_per_s_per_gpu"]), abs=1e-3)
    # rank 0 alone prints the table
    assert result.stdout.count("| model | pe |") == 1
    assert f"| {hybrid} | local+tapa-reference |" in result.stdout


# one torchrun of 2 processes, 2 configs: ~6 s on 2 cores
def test_packed_documents_under_cp2_and_cp1(tmp_path):
    out = tmp_path / "cp.csv"
    result = _torchrun(["--lengths", "64", "--pes", "tapa:LLLG:8", "--doc-mask", "8", "--warmup",
                        "0", "--steps", "1", "--csv", str(out)])
    assert result.returncode == 0, result.stderr[-5000:]
    rows = list(csv.DictReader(open(out)))
    assert [(r["cp"], r["doc_mask"]) for r in rows] == [("2", "8"), ("1", "8")]
    assert all(float(r["tokens_per_s"]) > 0 for r in rows)


def test_a_world_size_not_divisible_by_cp_is_a_clear_error(tmp_path):
    result = _torchrun(["--lengths", "32", "--cp", "4", "--csv", str(tmp_path / "cp.csv")])
    assert result.returncode != 0
    assert "--cp 4 needs a number of processes divisible by 4; torchrun started 2" in result.stderr
    assert not (tmp_path / "cp.csv").exists()


@pytest.mark.parametrize("args,message", [
    (["--lengths", "30", "--cp", "2"], "--lengths 30 under --cp 2: a row is cut into 2 x 2 = 4 equal "
                                       "chunks (head-tail load balancing), and 30 is not a multiple of 4"),
    (["--lengths", "32", "--cp", "2"], "--cp 2 shards each row over 2 processes: run it under torchrun "
                                       "--nproc-per-node 2"),
    (["--find-longest"], "--find-longest needs CUDA"),
    (["--doc-mask", "-5"], "--doc-mask is the documents' mean length in tokens (0: off), got -5"),
])
def test_argument_errors_are_one_clear_line(args, message, tmp_path):
    with pytest.raises(SystemExit, match="^tapa bench cp: ") as error:
        main(["bench", "cp", "--cpu-smoke", "--csv", str(tmp_path / "cp.csv"), *args])
    assert message in str(error.value) and "\n" not in str(error.value)
    assert not (tmp_path / "cp.csv").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA error")
def test_needs_cuda_without_the_smoke_flag(tmp_path):
    with pytest.raises(SystemExit, match="needs CUDA GPUs"):
        main(["bench", "cp", "--csv", str(tmp_path / "cp.csv")])


def test_find_longest_doubles_until_out_of_memory(tmp_path, monkeypatch, capsys):
    """The search on one process, its measure replaced: rows of 64 and 128 tokens train, 256 runs
    out of memory; the CSV holds all three and the report names 128."""
    from tapa.train.distributed import setup_distributed

    def measure(cfg, *, seq_len, parallel, info, checkpointing, warmup, steps, doc_mask):
        if seq_len >= 256:
            raise torch.OutOfMemoryError("CUDA out of memory (stand-in)")
        return {"pe": cfg.label, "attention": "sdpa", "checkpointing": checkpointing,
                "seq_len": seq_len, "cp": 1, "processes": 1, "rows": 1, "step_ms": 1.0,
                "tokens_per_s": 1e3 * seq_len, "tokens_per_s_per_gpu": 1e3 * seq_len,
                "peak_mem_gib": "n/a"}

    monkeypatch.setattr(bench_cp, "measure", measure)
    parser = argparse.ArgumentParser()
    bench_cp.add_arguments(parser)
    out = tmp_path / "cp.csv"
    args = parser.parse_args(["--lengths", "64", "--pes", "rope", "--cp", "1", "--checkpointing",
                              "off", "--csv", str(out), "--cpu-smoke"])
    args.find_longest = True  # past check_plan, which refuses it on CPU
    assert bench_cp._run(args, [1], setup_distributed("cpu")) == 0
    rows = list(csv.DictReader(open(out)))
    assert [(r["seq_len"], r["attention"]) for r in rows] == [("64", "sdpa"), ("128", "sdpa"), ("256", "OOM")]
    assert ("longest row that trained (RoPE, CP 1, checkpointing off, 1 process(es)): 128 tokens; "
            "256 ran out of memory") in capsys.readouterr().out


def test_cpu_smoke_rows_default_to_smoke_lengths(tmp_path, monkeypatch):
    """--cpu-smoke without --lengths trains rows of 64 and 128 tokens (bench model --cpu-smoke's):
    it took the GPU rows of 131072 and 262144 tokens before, minutes of silence on a CPU and then
    an out-of-memory kill. The measure is a stand-in that records the rows it was given."""
    seen = []

    def measure(cfg, *, seq_len, parallel, info, checkpointing, warmup, steps, doc_mask):
        seen.append(seq_len)
        return {"pe": cfg.label, "attention": "sdpa", "checkpointing": checkpointing,
                "seq_len": seq_len, "cp": 1, "processes": 1, "rows": 1, "step_ms": 1.0,
                "tokens_per_s": 1.0, "tokens_per_s_per_gpu": 1.0, "peak_mem_gib": "n/a"}

    monkeypatch.setattr(bench_cp, "measure", measure)
    assert main(["bench", "cp", "--cpu-smoke", "--pes", "rope", "--checkpointing", "off",
                 "--csv", str(tmp_path / "cp.csv")]) == 0
    assert seen == [64, 128]
    seen.clear()
    assert main(["bench", "cp", "--cpu-smoke", "--pes", "rope", "--checkpointing", "off", "--lengths",
                 "32", "--csv", str(tmp_path / "cp.csv")]) == 0
    assert seen == [32]
