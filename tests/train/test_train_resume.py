"""Exact resume, checkpoint integrity, load_model, and the errors for bad runs and checkpoints."""

import dataclasses
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from trainkit import losses, records, small_configs, one_thread  # noqa: F401 (autouse fixture)

from tapa.data import build_corpus
from tapa.train.saving import CheckpointError, load_model, resolve_checkpoint
from tapa.train.loader import validation_windows
from tapa.train.trainer import lr_at, train


@pytest.fixture(scope="module")
def full_run(tmp_path_factory, cache_dir):
    """An uninterrupted 6-step run, checkpoints at 3 and 6."""
    run_dir = tmp_path_factory.mktemp("runs") / "full"
    train(*small_configs(run_dir, cache_dir))
    return run_dir


def test_resume_is_bit_exact(full_run, cache_dir, tmp_path):
    run_dir = tmp_path / "interrupted"
    train(*small_configs(run_dir, cache_dir, stop_after=3))
    assert len(records(run_dir)) == 3
    train(*small_configs(run_dir, cache_dir, resume=True))
    assert [r["step"] for r in records(run_dir)] == list(range(1, 7))
    assert losses(run_dir) == losses(full_run)  # bit for bit
    assert [r["val_loss"] for r in records(run_dir)] == [r["val_loss"] for r in records(full_run)]
    final_a = load_file(resolve_checkpoint(run_dir) / "model.safetensors")
    final_b = load_file(resolve_checkpoint(full_run) / "model.safetensors")
    assert all(torch.equal(final_a[name], final_b[name]) for name in final_b)


def test_checkpoint_layout_and_load_model(full_run, cache_dir):
    checkpoints = full_run / "checkpoints"
    assert (checkpoints / "latest").read_text().strip() == "step_000006"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["latest", "step_000003", "step_000006"]
    state = json.loads((checkpoints / "step_000006" / "state.json").read_text())
    assert (state["step"], state["tokens"]) == (6, 6 * 4 * 32)
    config = json.loads((full_run / "config.json").read_text())
    assert set(config) >= {"model", "data", "train", "corpus"}
    assert (full_run / "metrics.csv").read_text().splitlines()[0].startswith("step,tokens,loss,lr")

    model, model_cfg, run_config = load_model(full_run)
    assert model_cfg.to_dict() == config["model"] and run_config == config
    assert not model.training
    # the logged final validation loss is reproduced from the saved weights
    corpus = build_corpus(small_configs(full_run, cache_dir)[2], progress=False)
    windows = torch.from_numpy(validation_windows(corpus.tokens("val"), 32, 4))
    with torch.no_grad():
        val_loss = F.cross_entropy(model(windows[:, :-1]).flatten(0, 1), windows[:, 1:].flatten())
    assert val_loss.item() == pytest.approx(records(full_run)[-1]["val_loss"], rel=1e-5)
    # a checkpoint directory works as well as its run directory
    again, _, _ = load_model(checkpoints / "step_000003")
    assert not torch.equal(again.embed.weight, model.embed.weight)


def test_keep_last_k(cache_dir, tmp_path):
    run_dir = tmp_path / "keep"
    train(*small_configs(run_dir, cache_dir, steps=4, save_every=1, keep_checkpoints=2,
                         eval_every=0))
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("step_*")) == ["step_000003",
                                                                                  "step_000004"]
    assert not list((run_dir / "checkpoints").glob(".tmp*"))


def test_corrupt_checkpoint_is_an_error(full_run, cache_dir, tmp_path):
    import shutil

    run_dir = tmp_path / "corrupt"
    shutil.copytree(full_run, run_dir)
    weights = resolve_checkpoint(run_dir) / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-5] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="corrupt"):
        load_model(run_dir)
    with pytest.raises(CheckpointError, match="corrupt"):
        train(*small_configs(run_dir, cache_dir, steps=8, resume=True))
    (resolve_checkpoint(run_dir) / "state.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="cannot read"):
        load_model(run_dir)
    (run_dir / "checkpoints" / "latest").write_text("step_999999\n")
    with pytest.raises(CheckpointError, match="not a complete checkpoint"):
        load_model(run_dir)
    with pytest.raises(CheckpointError, match="does not exist"):
        load_model(tmp_path / "nowhere")


def test_mismatched_runs_are_errors(full_run, cache_dir, tmp_path):
    with pytest.raises(ValueError, match="already holds a run; pass --resume"):
        train(*small_configs(full_run, cache_dir))
    with pytest.raises(ValueError, match="model.dim: 32 -> 64"):
        train(*small_configs(full_run, cache_dir, model=dict(dim=64), resume=True))
    with pytest.raises(ValueError, match="train.lr"):
        train(*small_configs(full_run, cache_dir, lr=1e-2, resume=True))
    with pytest.raises(ValueError, match="no checkpoint"):
        train(*small_configs(tmp_path / "empty", cache_dir, resume=True))
    with pytest.raises(ValueError, match="keeps the checkpoint's theta"):
        train(*small_configs(tmp_path / "continual", cache_dir, model=dict(theta=0.25),
                             init_from=str(full_run)))
    # a checkpoint whose weights do not fit its recorded config
    state_path = resolve_checkpoint(full_run) / "state.json"
    state = json.loads(state_path.read_text())
    state["model"]["n_layers"] = 3
    bad = tmp_path / "bad_ckpt"
    import shutil

    shutil.copytree(resolve_checkpoint(full_run), bad)
    (bad / "state.json").write_text(json.dumps(state))
    with pytest.raises(CheckpointError, match="does not match the model config"):
        load_model(bad)


def test_continual_keeps_weights_and_changes_length(full_run, cache_dir, tmp_path):
    run_dir = tmp_path / "continual"
    train_cfg, _, data_cfg = small_configs(run_dir, cache_dir, seq_len=64, steps=2, eval_every=0,
                                           init_from=str(full_run))
    train(train_cfg, None, data_cfg)
    config = json.loads((run_dir / "config.json").read_text())
    assert config["init_from"].endswith("step_000006")
    assert config["model"] == json.loads((full_run / "config.json").read_text())["model"]
    first = records(run_dir)[0]["loss"]
    assert first < records(full_run)[0]["loss"] - 0.2  # starts from the trained weights


def test_schedule():
    cfg, _, _ = small_configs("unused", "unused", steps=100, warmup_steps=10, lr=1.0)
    cfg = dataclasses.replace(cfg, min_lr_ratio=0.1)
    values = np.array([lr_at(s, cfg) for s in range(100)])
    assert values[0] == pytest.approx(0.1) and values[9] == pytest.approx(1.0)
    assert (np.diff(values[9:]) <= 1e-12).all() and values[-1] == pytest.approx(0.1, abs=1e-3)


def test_passkey_mixing_trains(cache_dir, tmp_path):
    run_dir = tmp_path / "passkey"
    train(*small_configs(run_dir, cache_dir, seq_len=256, batch_size=2, steps=2, eval_every=0,
                         passkey_fraction=0.5))
    assert len(records(run_dir)) == 2 and all(np.isfinite(losses(run_dir)))
