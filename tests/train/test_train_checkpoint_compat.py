"""Checkpoints written before TAPA's phase rows became their own parameters (one W_q / W_k per
layer, each head's amplitude then phase rows; two optimizer groups): their model loads with the
same logits and continues with --init-from; resuming their optimizer state is a clear error."""

import json
import shutil

import pytest
import torch
from helpers import earlier_phase_layout
from safetensors.torch import load_file, save_file
from trainkit import records, small_configs, one_thread  # noqa: F401 (autouse fixture)

from tapa.model.loading import CheckpointError, file_sha256, load_model, resolve_checkpoint
from tapa.train.trainer import train


def _rewrite_as_old(checkpoint, lm) -> None:
    save_file(earlier_phase_layout(lm, load_file(checkpoint / "model.safetensors")),
              checkpoint / "model.safetensors")
    optimizer = torch.load(checkpoint / "optimizer.pt", weights_only=True)
    for key in list(optimizer["state"]):
        if "_phase" in key:
            del optimizer["state"][key]
    groups = optimizer["param_groups"]
    for group in groups:
        group.pop("lr_scale")
        group["params"] = [name for name in group["params"] if "_phase" not in name]
    optimizer["param_groups"] = [group for group in groups if group["params"]]
    torch.save(optimizer, checkpoint / "optimizer.pt")
    state = json.loads((checkpoint / "state.json").read_text())
    state["sha256"] = {name: file_sha256(checkpoint / name) for name in state["sha256"]}
    (checkpoint / "state.json").write_text(json.dumps(state))


def test_earlier_checkpoints_load_and_continue(cache_dir, tmp_path):
    run_dir = tmp_path / "run"
    train(*small_configs(run_dir, cache_dir, steps=2, save_every=2, eval_every=0))
    model, _, _ = load_model(run_dir)
    old = tmp_path / "old"
    shutil.copytree(run_dir, old)
    _rewrite_as_old(resolve_checkpoint(old), model)
    assert load_file(resolve_checkpoint(old) / "model.safetensors")["layers.0.attn.wq.weight"].shape[0] == 32

    loaded, _, _ = load_model(old)
    ids = torch.randint(0, model.config.vocab_size, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids), model(ids), atol=0, rtol=0)

    with pytest.raises(CheckpointError, match="optimizer state .* does not fit.*--init-from"):
        train(*small_configs(old, cache_dir, steps=4, save_every=2, eval_every=0, resume=True))
    cont = tmp_path / "cont"
    train_cfg, _, data_cfg = small_configs(cont, cache_dir, steps=1, eval_every=0, init_from=str(old))
    train(train_cfg, None, data_cfg)
    assert records(cont)[0]["loss"] < records(run_dir)[0]["loss"]
