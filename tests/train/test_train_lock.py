"""Issue 34, the `tapa train` cases: one run directory is one run (a lock, case 1), a NaN
validation loss is a failure (3), a file size limit while model.safetensors is written (9), a
memory estimate before the first step (10), and --resume with other data settings refused before
a cache is built (11). Each failed, or gave a silently wrong result, before its fix."""

import dataclasses
import json
import math
import os
import re
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import one_line_error as fails
from trainkit import data_config, one_thread  # noqa: F401 (autouse fixture)

from tapa.cli import main

SRC = Path(__file__).resolve().parents[2] / "src"


def flags(run_dir, cache_dir, *extra):
    """`tapa train` of the tiny recipe, made seconds-long: 32-token rows, the 200 kB corpus."""
    return ["train", "--recipe", "tiny", "--run-dir", str(run_dir), "--seq-len", "32", "--vocab-size", "300",
            "--max-train-bytes", "200000", "--cache-dir", str(cache_dir), "--no-progress", "--no-plot",
            "--device", "cpu", *extra]


def _shell_env():
    env = {**os.environ, "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1"}
    env.pop("TAPA_DEBUG", None)
    return env


@pytest.fixture(scope="module")
def corpus(cache_dir):
    from tapa.data import build_corpus

    return build_corpus(data_config(cache_dir), progress=False)


# ---------------------------------------------------------------------------------------------
# case 1: two trainers in one run directory


def _wait_for(path: Path, process: subprocess.Popen, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if process.poll() is not None:
            raise AssertionError(f"the first trainer ended early: {process.stderr.read()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} did not appear in {timeout} s")
        time.sleep(0.1)


def test_a_second_trainer_beside_a_live_one_stops_at_once(corpus, cache_dir, tmp_path, capsys):
    run_dir = tmp_path / "run"
    first = subprocess.Popen([sys.executable, "-m", "tapa",
                              *flags(run_dir, cache_dir, "--steps", "100000", "--save-every", "1",
                                     "--log-every", "1", "--eval-every", "0")],
                             env=_shell_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(run_dir / "checkpoints" / "latest", first)
        config = (run_dir / "config.json").read_bytes()
        live = rf"is in use by tapa train \(pid {first.pid} on .*\); wait for it"
        started = time.monotonic()
        fails(flags(run_dir, cache_dir, "--steps", "4", "--lr", "3e-3"), live)  # a second run
        fails(flags(run_dir, cache_dir, "--resume"), live)  # a resume beside the live run
        fails(["train", "--run-dir", str(run_dir), "--resume", "--no-progress"], live)
        assert time.monotonic() - started < 15
        assert (run_dir / "config.json").read_bytes() == config  # still the first run's 1e-3
        assert json.loads(config)["train"]["lr"] == 1e-3
    finally:
        first.send_signal(signal.SIGKILL)  # kill -9: the lock file still names it
        first.wait()
    assert json.loads((run_dir / ".tapa-run.lock").read_text())["pid"] == first.pid
    latest = (run_dir / "checkpoints" / "latest").read_text().strip()
    step = int(latest.split("_")[1])
    capsys.readouterr()
    assert main(flags(run_dir, cache_dir, "--resume", "--steps", str(step + 1))) == 0
    err = capsys.readouterr().err
    assert f"took over the lock of tapa train (pid {first.pid} on " in err
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [record["step"] for record in records]
    assert steps == sorted(set(steps)) and steps[-1] == step + 1  # one run: no duplicate, in order
    assert (run_dir / ".tapa-run.lock").read_text() == ""  # released


def test_the_lock_in_one_process(tmp_path):
    from tapa.train.rundir import RunLock, RunLocked

    lock = RunLock(tmp_path / "run").acquire()
    assert lock.note is None
    with pytest.raises(RunLocked, match=rf"in use by tapa train \(pid {os.getpid()} on "):
        RunLock(tmp_path / "run").acquire()
    lock.release()
    with RunLock(tmp_path / "run") as again:  # released cleanly: no note
        assert again.note is None
    stale = tmp_path / "run" / ".tapa-run.lock"
    stale.write_text(json.dumps({"pid": 999999, "host": "elsewhere", "started": "2026-12-04T10:00:00"}))
    with RunLock(tmp_path / "run") as taken:
        assert "took over the lock of tapa train (pid 999999 on elsewhere" in taken.note


# ---------------------------------------------------------------------------------------------
# case 3: a NaN validation loss


def test_a_nan_validation_loss_fails_the_run_without_its_checkpoint(corpus, cache_dir, tmp_path):
    run_dir = tmp_path / "diverged"
    fails(flags(run_dir, cache_dir, "--lr", "1e6", "--steps", "3"),
          r"the validation loss is not finite \(nan\) at step 3; no checkpoint of this step was written")
    assert not (run_dir / "checkpoints" / "step_000003").exists()
    text = (run_dir / "metrics.jsonl").read_text()
    assert "NaN" not in text and "Infinity" not in text
    assert all(math.isfinite(json.loads(line)["loss"]) for line in text.splitlines())


def test_weights_that_are_not_finite_are_never_saved(tmp_path, monkeypatch):
    import torch

    from tapa.model import ModelConfig, TapaLM
    from tapa.train import saving
    from tapa.train.distributed import DistInfo

    model = TapaLM(ModelConfig(vocab_size=64, dim=32, n_layers=1, n_heads=2))
    with torch.no_grad():
        model.embed.weight[0, 0] = math.inf
    optimizer = torch.optim.AdamW(model.parameters())
    info = DistInfo(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"), initialized_here=False)
    with pytest.raises(saving.CheckpointError, match="weights are not finite at step 5 .*embed.weight"):
        saving.save_checkpoint(tmp_path, step=5, model=model, optimizer=optimizer, model_cfg=model.config,
                               info=info, keep=2, extra={})
    assert not (tmp_path / "checkpoints").exists() or not any((tmp_path / "checkpoints").iterdir())


# ---------------------------------------------------------------------------------------------
# case 9: the disk fills (a file size limit) while model.safetensors is written


def test_a_file_size_limit_during_the_weights_write_is_one_line(corpus, cache_dir, tmp_path):
    run_dir = tmp_path / "full"
    limit = 1_000_000  # the run's config and metrics fit; its 2.7 MB model.safetensors does not

    def limited():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

    result = subprocess.run([sys.executable, "-m", "tapa", *flags(run_dir, cache_dir, "--steps", "2",
                                                                 "--warmup-steps", "1")],  # no warmup note
                            env=_shell_env(), capture_output=True, text=True, timeout=300, preexec_fn=limited)
    assert result.returncode == 1, result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr
    assert re.match(r"tapa train: error: cannot write the checkpoint of step 2 .*: file too large .*The partial "
                    r"checkpoint was removed; the run has no checkpoint yet", result.stderr), result.stderr
    assert list((run_dir / "checkpoints").iterdir()) == []  # no .tmp-step_000002 left behind


def test_any_writer_error_removes_the_partial_checkpoint(tmp_path, monkeypatch):
    import safetensors.torch
    import torch
    from safetensors import SafetensorError

    from tapa.model import ModelConfig, TapaLM
    from tapa.train import saving
    from tapa.train.distributed import DistInfo

    def full_disk(tensors, filename, *args, **kwargs):
        Path(filename).write_bytes(b"partial")
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(safetensors.torch, "save_file", full_disk)
    model = TapaLM(ModelConfig(vocab_size=64, dim=32, n_layers=1, n_heads=2))
    info = DistInfo(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"), initialized_here=False)
    with pytest.raises(saving.CheckpointWriteError, match="step 1 .*: no space left on device. The partial"):
        saving.save_checkpoint(tmp_path, step=1, model=model, optimizer=torch.optim.AdamW(model.parameters()),
                               model_cfg=model.config, info=info, keep=2, extra={})
    assert list((tmp_path / "checkpoints").iterdir()) == []


# ---------------------------------------------------------------------------------------------
# case 10: a run that cannot fit in memory


def test_a_run_larger_than_memory_is_refused_before_it_starts(cache_dir, tmp_path):
    """The issue's command, on a machine given 16 GiB (and an address-space limit, so that a run
    that did start would fail quickly instead of filling this machine's memory)."""
    code = ("import tapa.train.command as c; c.device_memory = lambda device: (16 * 2**30, 'RAM'); "
            "from tapa.cli import main; raise SystemExit(main())")
    argv = flags(tmp_path / "long", cache_dir, "--seq-len", "262144", "--batch-size", "1", "--steps", "1")

    def limited():
        resource.setrlimit(resource.RLIMIT_AS, (6 * 2**30, resource.RLIM_INFINITY))

    started = time.monotonic()
    result = subprocess.run([sys.executable, "-c", code, *argv], env=_shell_env(), capture_output=True,
                            text=True, timeout=120, preexec_fn=limited)
    assert result.returncode == 1 and result.stderr.count("\n") == 1, result.stderr
    assert re.match(r"tapa train: error: this run needs about \d+\.\d GiB \(\d+\.\d GiB of activations for 1 x 262144 "
                    r"tokens per micro-batch.*more than the 16\.0 GiB of RAM; lower --seq-len", result.stderr)
    assert time.monotonic() - started < 60
    assert not (tmp_path / "long").exists()


def test_more_than_half_the_memory_is_a_warning(monkeypatch, capsys):
    import tapa.train.command as command
    from tapa.train.config import build_configs, load_recipe

    train_cfg, model_cfg, data_cfg = build_configs(load_recipe("tiny"), {"train": {"device": "cpu"}})
    estimate = command.estimate_memory(train_cfg, model_cfg, data_cfg.vocab_size, "cpu")
    need = estimate["activations"] + estimate["state"]
    monkeypatch.setattr(command, "device_memory", lambda device: (need * 1.5, "RAM"))
    command.check_memory(train_cfg, model_cfg, data_cfg)
    assert "tapa train: warning: this run needs about" in capsys.readouterr().err
    monkeypatch.setattr(command, "device_memory", lambda device: (need * 3, "RAM"))
    command.check_memory(train_cfg, model_cfg, data_cfg)
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(command, "device_memory", lambda device: (need * 0.9, "RAM"))
    with pytest.raises(ValueError, match="more than the"):
        command.check_memory(train_cfg, model_cfg, data_cfg)
    command.check_memory(train_cfg, model_cfg, data_cfg, skip=True)  # --skip-memory-check
    # activation checkpointing keeps a block's input per layer instead of all its activations
    lean = command.estimate_memory(dataclasses.replace(train_cfg, activation_checkpointing=True),
                                   model_cfg, data_cfg.vocab_size, "cpu")
    assert lean["activations"] < estimate["activations"] / 2
    # selective: recomputing some blocks lands between the two
    some = command.estimate_memory(dataclasses.replace(train_cfg, activation_checkpointing=True,
                                                       checkpoint_blocks=model_cfg.n_layers // 2),
                                   model_cfg, data_cfg.vocab_size, "cpu")
    assert lean["activations"] < some["activations"] < estimate["activations"]


def test_checkpoint_blocks_needs_activation_checkpointing_and_fits_the_model(tmp_path, cache_dir):
    from tapa.train.config import TrainConfig

    with pytest.raises(ValueError, match="add --activation-checkpointing"):
        TrainConfig(checkpoint_blocks=2)
    with pytest.raises(ValueError, match="checkpoint_blocks must be an int >= 0"):
        TrainConfig(checkpoint_blocks=-1, activation_checkpointing=True)
    fails(flags(tmp_path / "run", cache_dir, "--activation-checkpointing", "--checkpoint-blocks", "99"),
          r"checkpoint_blocks \(99\) is more than the model's \d+ blocks")
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------------------------------------
# case 11: --resume with another vocabulary


def test_resume_with_other_data_settings_builds_no_cache(corpus, cache_dir, tmp_path):
    run_dir = tmp_path / "run"
    assert main(flags(run_dir, cache_dir, "--steps", "2")) == 0
    cached = sorted(p.name for p in Path(cache_dir).iterdir())
    started = time.monotonic()
    fails(["train", "--run-dir", str(run_dir), "--resume", "--vocab-size", "1024", "--no-progress"],
          r"--resume: the requested config differs from the run .*data.vocab_size: 300 -> 1024")
    assert time.monotonic() - started < 10
    assert sorted(p.name for p in Path(cache_dir).iterdir()) == cached
