"""phase_lr_scale: the TAPA phase parameters learn at lr * phase_lr_scale through their own AdamW
parameter groups (a gradient hook would do nothing: Adam is invariant to gradient scale), saved with
the run, honoured on resume and on continual runs. DDP and FSDP2: test_train_distributed.py."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file
from trainkit import SMALL_MODEL, records, small_configs, one_thread  # noqa: F401 (autouse fixture)

from tapa.cli import main
from tapa.model import ModelConfig, TapaLM, is_phase_parameter
from tapa.train.saving import resolve_checkpoint
from tapa.train.config import TrainConfig
from tapa.train.trainer import make_optimizer, set_lr


def _phase_names(model) -> set[str]:
    return {name for name, _ in model.named_parameters() if is_phase_parameter(name)}


@pytest.mark.parametrize("phase_matrix", ["none", "diagonal", "full"])
def test_groups_hold_the_right_parameters_and_learning_rates(phase_matrix):
    model = TapaLM(ModelConfig(**SMALL_MODEL, phase_matrix=phase_matrix))
    phase = _phase_names(model)
    per_layer = 2 + (phase_matrix != "none")  # W_q's and W_k's phase rows, and N
    assert len(phase) == per_layer * model.config.n_layers
    assert all(("wq_phase" in n or "wk_phase" in n or "phase_matrix" in n) for n in phase)

    optimizer = make_optimizer(model, TrainConfig(lr=1e-3, weight_decay=0.1, phase_lr_scale=0.25))
    set_lr(optimizer, 2e-3)
    names = {id(p): name for name, p in model.named_parameters()}
    grouped = [names[id(p)] for group in optimizer.param_groups for p in group["params"]]
    assert sorted(grouped) == sorted(names.values())  # every parameter exactly once
    for group in optimizer.param_groups:
        members = {names[id(p)] for p in group["params"]}
        is_phase = members <= phase
        assert is_phase or members.isdisjoint(phase)
        assert group["lr"] == pytest.approx(2e-3 * (0.25 if is_phase else 1.0))
        decays = {p.dim() >= 2 for p in group["params"]}
        assert len(decays) == 1 and group["weight_decay"] == (0.1 if decays.pop() else 0.0)

    rope = TapaLM(ModelConfig(**{**SMALL_MODEL, "pe": "rope"}))
    assert not _phase_names(rope) and len(make_optimizer(rope, TrainConfig()).param_groups) == 2


def test_phase_lr_scale_zero_freezes_only_the_phase_parameters():
    torch.manual_seed(0)
    model = TapaLM(ModelConfig(**SMALL_MODEL, vocab_size=64, phase_matrix="diagonal"))
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    optimizer = make_optimizer(model, TrainConfig(lr=1e-2, phase_lr_scale=0.0))
    set_lr(optimizer, 1e-2)
    tokens = torch.randint(0, 64, (2, 17))
    model.loss(tokens[:, :-1], tokens[:, 1:]).backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
    optimizer.step()
    for name, param in model.named_parameters():
        moved = not torch.equal(param.detach(), before[name])
        assert moved != is_phase_parameter(name), name


def _cli(cache_dir, run_dir, *extra):
    return ["train", "--recipe", "tiny", "--cache-dir", str(cache_dir), "--vocab-size", "300",
            "--max-train-bytes", "200000", "--dim", "32", "--n-layers", "2", "--n-heads", "2",
            "--batch-size", "4", "--seq-len", "32", "--steps", "4", "--eval-every", "0",
            "--log-every", "1", "--no-progress", "--no-plot", "--device", "cpu",
            "--run-dir", str(run_dir), *extra]


def test_resume_and_continual_runs_keep_it(cache_dir, tmp_path):
    run_dir = tmp_path / "frozen"
    assert main(_cli(cache_dir, run_dir, "--phase-lr-scale", "0", "--stop-after", "2")) == 0
    assert main(["train", "--run-dir", str(run_dir), "--resume", "--no-progress"]) == 0
    config = json.loads((run_dir / "config.json").read_text())
    assert config["train"]["phase_lr_scale"] == 0.0 and records(run_dir)[-1]["step"] == 4
    # the resumed half kept the phase parameters at their initial values too
    torch.manual_seed(config["train"]["seed"])
    initial = TapaLM(ModelConfig.from_dict(config["model"])).state_dict()
    final = load_file(resolve_checkpoint(run_dir) / "model.safetensors")
    for name, tensor in final.items():
        assert torch.equal(tensor, initial[name]) == is_phase_parameter(name), name

    # a continual run inherits it from the run it starts from, unless a flag changes it
    inherited = tmp_path / "inherited"
    assert main(["train", "--init-from", str(run_dir), "--seq-len", "64", "--steps", "1",
                 "--run-dir", str(inherited), "--no-progress", "--no-plot"]) == 0
    assert json.loads((inherited / "config.json").read_text())["train"]["phase_lr_scale"] == 0.0
    changed = tmp_path / "changed"
    assert main(["train", "--init-from", str(run_dir), "--seq-len", "64", "--steps", "1",
                 "--phase-lr-scale", "0.5", "--run-dir", str(changed), "--no-progress",
                 "--no-plot"]) == 0
    assert json.loads((changed / "config.json").read_text())["train"]["phase_lr_scale"] == 0.5
    bare = tmp_path / "bare-checkpoint"  # outside its run: the checkpoint's state.json says it
    shutil.copytree(resolve_checkpoint(run_dir), bare)
    from_bare = tmp_path / "from-bare"
    assert main(["train", "--init-from", str(bare), "--cache-dir", str(cache_dir), "--vocab-size",
                 "300", "--max-train-bytes", "200000", "--seq-len", "64", "--steps", "1",
                 "--batch-size", "4", "--eval-batches", "1", "--run-dir", str(from_bare),
                 "--no-progress", "--no-plot"]) == 0
    assert json.loads((from_bare / "config.json").read_text())["train"]["phase_lr_scale"] == 0.0


def test_a_run_saved_before_the_field_resumes_at_one_learning_rate(cache_dir, tmp_path):
    run_dir = tmp_path / "old"
    assert main(_cli(cache_dir, run_dir, "--phase-lr-scale", "1", "--stop-after", "2")) == 0
    path = run_dir / "config.json"
    config = json.loads(path.read_text())
    del config["train"]["phase_lr_scale"]  # as written before phase_lr_scale existed
    path.write_text(json.dumps(config))
    assert main(["train", "--run-dir", str(run_dir), "--resume", "--no-progress"]) == 0
    assert json.loads(path.read_text())["train"]["phase_lr_scale"] == 1.0
    small_train, small_model, data = small_configs(tmp_path / "unused", cache_dir)
    assert TrainConfig.from_saved({k: v for k, v in small_train.to_dict().items()
                                   if k != "phase_lr_scale"}).phase_lr_scale == 1.0
