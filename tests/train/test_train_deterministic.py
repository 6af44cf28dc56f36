"""`tapa train --deterministic`: torch's deterministic algorithms for the run only, which also
sends TAPA's dQ to its ordered kernel (`tapa.ops.tapa.launch.dq_by_atomics`), recorded in config.json and
restored when the run ends or fails."""

import json
import os
from dataclasses import replace

import pytest
import torch
from trainkit import small_configs, one_thread  # noqa: F401 (autouse fixture)

from tapa.ops.tapa import configs, launch
from tapa.train import trainer


def _record_mode(monkeypatch, seen: list, fail: bool = False):
    """Wrap make_optimizer (called once the model is built) to note the mode the run trains in."""
    real = trainer.make_optimizer
    atomic = replace(configs.INTERPRETER, dq_atomic=True)

    def spy(*args, **kwargs):
        seen.append((torch.are_deterministic_algorithms_enabled(),
                     torch.is_deterministic_algorithms_warn_only_enabled(),
                     launch.dq_by_atomics(atomic)))
        if fail:
            raise RuntimeError("stop here")
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
    # inside: deterministic (warnings, not errors, for ops without a deterministic version) and
    # no dQ atomics; outside: as before
    assert seen == [(deterministic, deterministic, not deterministic)]
    assert not torch.are_deterministic_algorithms_enabled()
    assert json.loads((run_dir / "config.json").read_text())["train"]["deterministic"] is deterministic


def test_the_mode_is_restored_when_the_run_fails(cache_dir, tmp_path, monkeypatch):
    seen = []
    _record_mode(monkeypatch, seen, fail=True)
    train_cfg, model_cfg, data_cfg = small_configs(tmp_path / "run", cache_dir, steps=2, deterministic=True)
    with pytest.raises(RuntimeError, match="stop here"):
        trainer.train(train_cfg, model_cfg, data_cfg)
    assert seen[0][0] and not torch.are_deterministic_algorithms_enabled()


@pytest.mark.parametrize("deterministic", [True, False])
def test_an_earlier_strict_mode_is_kept(cache_dir, tmp_path, monkeypatch, deterministic):
    """A caller already in strict deterministic mode trains in it, and stays in it after the run,
    whether the run asked for the mode or not; the cuBLAS setting the run made is taken back."""
    seen = []
    _record_mode(monkeypatch, seen)
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    train_cfg, model_cfg, data_cfg = small_configs(tmp_path / "run", cache_dir, steps=1,
                                                   deterministic=deterministic)
    torch.use_deterministic_algorithms(True)
    try:
        trainer.train(train_cfg, model_cfg, data_cfg)
        assert seen == [(True, False, False)]
        assert torch.are_deterministic_algorithms_enabled()
        assert not torch.is_deterministic_algorithms_warn_only_enabled()
    finally:
        torch.use_deterministic_algorithms(False)
    assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ
