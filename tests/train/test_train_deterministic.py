"""`tapa train --deterministic`: torch's strict deterministic algorithms for the run only, which also
sends TAPA's dQ to its ordered kernel (`tapa.ops.tapa.launch.dq_by_atomics`), recorded in config.json and
restored when the run ends or fails; an op with no deterministic version stops the run, naming itself."""

import json
import os
from dataclasses import replace

import pytest
import torch
from trainkit import small_configs, one_thread  # noqa: F401 (autouse fixture)

from tapa.cli import main
from tapa.ops.tapa import configs, launch
from tapa.train import trainer


def _record_mode(monkeypatch, seen: list, op=None):
    """Wrap make_optimizer (called once the model is built) to note the mode the run trains in,
    then run `op` there if given."""
    real = trainer.make_optimizer
    atomic = replace(configs.INTERPRETER, dq_atomic=True)

    def spy(*args, **kwargs):
        seen.append((torch.are_deterministic_algorithms_enabled(),
                     torch.is_deterministic_algorithms_warn_only_enabled(),
                     launch.dq_by_atomics(atomic)))
        if op is not None:
            op()
        return real(*args, **kwargs)
    monkeypatch.setattr(trainer, "make_optimizer", spy)


@pytest.mark.parametrize("deterministic", [True, False])
def test_the_mode_holds_for_the_run_only(cache_dir, tmp_path, monkeypatch, deterministic):
    seen = []
    _record_mode(monkeypatch, seen)
    train_cfg, model_cfg, data_cfg = small_configs(tmp_path / "run", cache_dir, steps=2,
                                                   deterministic=deterministic)
    assert not torch.are_deterministic_algorithms_enabled()
    run_dir = trainer.train(train_cfg, model_cfg, data_cfg)
    # inside: deterministic and strict (errors, not warnings, for ops without a deterministic
    # version) and no dQ atomics; outside: as before
    assert seen == [(deterministic, False, not deterministic)]
    assert not torch.are_deterministic_algorithms_enabled()
    assert json.loads((run_dir / "config.json").read_text())["train"]["deterministic"] is deterministic


def _stop():
    raise RuntimeError("stop here")


def test_the_mode_is_restored_when_the_run_fails(cache_dir, tmp_path, monkeypatch):
    seen = []
    _record_mode(monkeypatch, seen, op=_stop)
    train_cfg, model_cfg, data_cfg = small_configs(tmp_path / "run", cache_dir, steps=2, deterministic=True)
    with pytest.raises(RuntimeError, match="stop here"):
        trainer.train(train_cfg, model_cfg, data_cfg)
    assert seen[0][0] and not torch.are_deterministic_algorithms_enabled()


@pytest.mark.parametrize("warn_only", [False, True])
@pytest.mark.parametrize("deterministic", [True, False])
def test_a_callers_own_mode_is_kept(cache_dir, tmp_path, monkeypatch, deterministic, warn_only):
    """A caller already in torch's deterministic mode, strict or warn-only, trains in it and stays
    in it after the run, whether the run asked for the mode or not; the cuBLAS setting the run made
    is taken back."""
    seen = []
    _record_mode(monkeypatch, seen)
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    train_cfg, model_cfg, data_cfg = small_configs(tmp_path / "run", cache_dir, steps=1,
                                                   deterministic=deterministic)
    torch.use_deterministic_algorithms(True, warn_only=warn_only)
    try:
        trainer.train(train_cfg, model_cfg, data_cfg)
        assert seen == [(True, warn_only, False)]
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.is_deterministic_algorithms_warn_only_enabled() is warn_only
    finally:
        torch.use_deterministic_algorithms(False)
    assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ


def _put():  # Tensor.put_ has no deterministic version, on CPU too
    torch.zeros(3).put_(torch.tensor([0]), torch.tensor([1.0]))


def test_an_op_with_no_deterministic_version_stops_the_run_naming_itself(cache_dir, tmp_path, monkeypatch):
    _record_mode(monkeypatch, [], op=_put)
    train_cfg, model_cfg, data_cfg = small_configs(tmp_path / "run", cache_dir, steps=1, deterministic=True)
    with pytest.raises(trainer.NotDeterministicError, match=r"^--deterministic: put_ has no deterministic"):
        trainer.train(train_cfg, model_cfg, data_cfg)
    assert not torch.are_deterministic_algorithms_enabled()
    # without --deterministic the op runs, and under a caller's own strict mode torch's error is kept
    trainer.train(replace(train_cfg, deterministic=False, run_dir=str(tmp_path / "plain")), model_cfg, data_cfg)
    torch.use_deterministic_algorithms(True)
    try:
        with pytest.raises(RuntimeError, match="^put_ does not have a deterministic implementation"):
            trainer.train(replace(train_cfg, deterministic=False, run_dir=str(tmp_path / "strict")),
                          model_cfg, data_cfg)
    finally:
        torch.use_deterministic_algorithms(False)


def test_the_command_line_says_it_in_one_line(cache_dir, tmp_path, monkeypatch):
    _record_mode(monkeypatch, [], op=_put)
    with pytest.raises(SystemExit, match=r"^tapa train: error: --deterministic: put_ has no deterministic"):
        main(["train", "--recipe", "tiny", "--run-dir", str(tmp_path / "run"), "--seq-len", "32",
              "--vocab-size", "300", "--max-train-bytes", "200000", "--cache-dir", str(cache_dir),
              "--steps", "1", "--warmup-steps", "1", "--no-progress", "--no-plot", "--device", "cpu",
              "--deterministic"])
