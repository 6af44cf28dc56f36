"""Shared pieces of the training tests (importable as `trainkit` from tests/train)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tapa.data import DataConfig
from tapa.model import ModelConfig
from tapa.train.config import TrainConfig

# A model small enough for a step in milliseconds: head_dim 16 splits 8 + 8 under theta 0.5.
SMALL_MODEL = dict(dim=32, n_layers=2, n_heads=2, phase_init_scale=0.1)


def data_config(cache_dir: Path) -> DataConfig:
    """200 kB of the stdlib, a 300-token BPE: builds in about a second, then cached."""
    return DataConfig(source="builtin", cache_dir=str(cache_dir), vocab_size=300,
                      max_train_bytes=200_000)


def small_configs(run_dir: Path, cache_dir: Path, *, model: dict | None = None, **train):
    """(TrainConfig, ModelConfig, DataConfig) of a seconds-long CPU run."""
    train_values = dict(name="test", run_dir=str(run_dir), seq_len=32, batch_size=4, steps=6,
                        lr=3e-3, warmup_steps=2, eval_every=3, eval_batches=1, save_every=3,
                        log_every=1, progress=False, plot=False, device="cpu")
    train_values.update(train)
    return (TrainConfig(**train_values), ModelConfig(**{**SMALL_MODEL, **(model or {})}),
            data_config(cache_dir))


def records(run_dir: Path) -> list[dict]:
    lines = (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line]


def losses(run_dir: Path) -> list[float]:
    return [r["loss"] for r in records(run_dir)]


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models run fastest on one thread, above all on a busy 2-core CI machine; restore after."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


# gloo on CPU now and then aborts a torchrun at exit with this (a known race in its teardown)
TORCHRUN_ABORT = "terminate called without an active exception"


def torchrun_train(nproc: int, args: list[str], timeout: int = 300) -> None:
    """`tapa train ARGS` under torchrun with nproc CPU processes; one retry (resuming what the run
    saved) when gloo aborts at exit; an AssertionError with torchrun's stderr when it fails."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc_per_node", str(nproc), "-m", "tapa.cli", "train", *args]
    for _ in range(2):
        result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
        if result.returncode == 0 or TORCHRUN_ABORT not in result.stderr:
            break
        if "--resume" not in command:
            command.append("--resume")
    if result.returncode != 0:
        raise AssertionError(f"torchrun failed ({result.returncode}):\n{result.stderr[-20000:]}")


def cli_args(train_cfg, model_cfg, data_cfg) -> list[str]:
    """The `tapa train` command line of a small_configs() run."""
    args = ["--run-dir", train_cfg.run_dir, "--cache-dir", data_cfg.cache_dir,
            "--vocab-size", str(data_cfg.vocab_size), "--max-train-bytes", str(data_cfg.max_train_bytes)]
    for field in ("seq_len", "batch_size", "steps", "lr", "warmup_steps", "eval_every",
                  "eval_batches", "save_every", "log_every", "device", "phase_lr_scale"):
        args += [f"--{field.replace('_', '-')}", str(getattr(train_cfg, field))]
    for field in ("dim", "n_layers", "n_heads", "phase_init_scale", "layer_pattern", "local_window"):
        args += [f"--{field.replace('_', '-')}", str(getattr(model_cfg, field))]
    return args + ["--recipe", "tiny", "--name", train_cfg.name, "--no-progress", "--no-plot"]
