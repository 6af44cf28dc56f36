"""Shared pieces of the training tests (importable as `trainkit` from tests/train)."""

from __future__ import annotations

import json
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
