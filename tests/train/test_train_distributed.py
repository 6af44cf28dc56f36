"""torchrun with 2 CPU processes (gloo): DDP and FSDP2 give the single-process loss curve and
weights over the same global batch, and an FSDP2 checkpoint saved by 2 processes resumes on 1 and
on 2. The model is a hybrid (local sliding-window RoPE layers, global TAPA layers: issue 10) whose
phase parameters learn at their own rate (phase_lr_scale, found by name under DDP's and FSDP2's
wrappers: issue 11)."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file
from trainkit import cli_args, losses, one_thread, records, small_configs, torchrun_train  # noqa: F401

from tapa.train.saving import resolve_checkpoint
from tapa.train.trainer import train

# torchrun with 2 processes: 6-21 s a test on 2 CPU cores (measured 2026-12-04); the full run has them
pytestmark = pytest.mark.slow

# float32 sums in another order (gradient all-reduce, sharded norms) differ in the last bits
# (measured: ~5e-7 over 6 steps); a wrong data shard or a missing all-reduce moves the loss ~1e-2
TOLERANCE = 1e-5
# a hybrid with a window shorter than seq_len (32), so local layers really cut attention off
HYBRID = dict(n_layers=4, layer_pattern="LLLG", local_window=8)
PHASE_LR_SCALE = 0.3  # not the default, and far from 1: a phase group lost under a wrapper shows


def _configs(run_dir, cache_dir, **train):
    return small_configs(run_dir, cache_dir, model=HYBRID, phase_lr_scale=PHASE_LR_SCALE, **train)


# Seen about once in 20 two-process gloo runs (2026-12-01, torch 2.13 CPU): a worker aborts with
# "terminate called without an active exception" (a C++ thread left joinable; the cause is not
# found). One retry keeps that from failing CI; a second abort, or any other failure, fails the
# test, and the results are compared after the run either way (a resumed run repeats exactly).

@pytest.fixture(scope="module")
def single(tmp_path_factory, cache_dir):
    """The reference: one process, global batch 4, 6 steps."""
    run_dir = tmp_path_factory.mktemp("runs") / "single"
    train(*_configs(run_dir, cache_dir))
    return run_dir


def _close(a, b):
    return len(a) == len(b) and all(abs(x - y) <= TOLERANCE for x, y in zip(a, b))


def _same_weights(run_a, run_b) -> None:
    a = load_file(resolve_checkpoint(run_a) / "model.safetensors")
    b = load_file(resolve_checkpoint(run_b) / "model.safetensors")
    assert sorted(a) == sorted(b) and any("wq_phase" in name for name in a)
    for name in a:
        assert torch.allclose(a[name], b[name], rtol=0, atol=TOLERANCE), name


def test_ddp_two_processes_match_one(single, cache_dir, tmp_path):
    configs = _configs(tmp_path / "ddp", cache_dir)
    torchrun_train(2, cli_args(*configs) + ["--parallel", "ddp"])
    assert _close(losses(tmp_path / "ddp"), losses(single)), (losses(tmp_path / "ddp"), losses(single))
    _same_weights(tmp_path / "ddp", single)
    val = [r["val_loss"] or 0 for r in records(tmp_path / "ddp")]
    assert _close(val, [r["val_loss"] or 0 for r in records(single)])


def test_ddp_resumes_on_two_processes(single, cache_dir, tmp_path):
    """A DDP run stopped at step 3 and resumed by 2 processes ends as the single-process run.
    (The resume once failed: torch renamed the keys of the loaded weights to DDP's module.* in
    place, and the optimizer check then found none of its parameters.)"""
    run = tmp_path / "ddp"
    torchrun_train(2, cli_args(*_configs(run, cache_dir)) + ["--parallel", "ddp", "--stop-after", "3"])
    torchrun_train(2, ["--run-dir", str(run), "--resume", "--no-progress", "--parallel", "ddp"])
    assert _close(losses(run), losses(single)), (losses(run), losses(single))
    _same_weights(run, single)


def test_fsdp2_two_processes_match_one_and_resume_on_other_world_sizes(single, cache_dir, tmp_path):
    saved = tmp_path / "fsdp"
    configs = _configs(saved, cache_dir)
    torchrun_train(2, cli_args(*configs) + ["--parallel", "fsdp", "--stop-after", "3"])
    assert _close(losses(saved), losses(single)[:3]), (losses(saved), losses(single))
    assert json.loads((saved / "checkpoints" / "step_000003" / "state.json").read_text())["world_size"] == 2

    on_one = tmp_path / "resume1"
    shutil.copytree(saved, on_one)
    train(*_configs(on_one, cache_dir, parallel="fsdp", resume=True))  # world size 1
    assert _close(losses(on_one), losses(single)), (losses(on_one), losses(single))
    _same_weights(on_one, single)

    on_two = tmp_path / "resume2"
    shutil.copytree(saved, on_two)
    torchrun_train(2, ["--run-dir", str(on_two), "--resume", "--no-progress", "--parallel", "fsdp"])
    assert _close(losses(on_two), losses(single)), (losses(on_two), losses(single))
    _same_weights(on_two, single)
