"""Fault injection (issue 12): bad hyperparameters and recipe types, a diverging run, a full disk,
a killed first checkpoint, truncated run files, and the logged loss of a resume off the log
schedule. Each case failed, or gave a silently wrong result, before its fix."""

import errno
import json
import math
import shutil

import pytest
import torch
from trainkit import losses, records, small_configs, one_thread  # noqa: F401 (autouse fixture)

from tapa.cli import main
from tapa.train import saving as ckpt
from tapa.train.config import TrainConfig, build_configs, load_recipe
from tapa.train.trainer import NonFiniteError, train

# ---------------------------------------------------------------------------------------------
# configuration


@pytest.mark.parametrize("field, value", [("lr", math.inf), ("weight_decay", math.nan),
                                          ("grad_clip", math.nan), ("beta2", math.nan),
                                          ("phase_lr_scale", math.inf), ("min_lr_ratio", math.nan),
                                          ("passkey_fraction", math.nan)])
def test_non_finite_hyperparameters_are_rejected(field, value):
    with pytest.raises(ValueError, match=f"{field} must be a finite number"):
        TrainConfig(**{field: value})


def test_non_finite_flags_are_one_line_errors():
    with pytest.raises(SystemExit, match="lr must be a finite number, got inf"):
        main(["train", "--lr", "inf", "--print-config"])
    with pytest.raises(SystemExit, match="grad_clip must be a finite number, got nan"):
        main(["train", "--grad-clip", "nan", "--print-config"])


def test_a_warmup_longer_than_the_run_is_noted(capsys):
    """The recipe tiny warms up over 20 steps; with --steps 10 the lr never reaches its peak, which
    used to pass without a word."""
    assert main(["train", "--recipe", "tiny", "--steps", "10", "--lr", "1e-3", "--print-config"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["train"]["warmup_steps"] == 20
    assert "note: --warmup-steps 20 is longer than --steps 10: the lr rises to 0.0005 and never reaches " \
           "its peak 0.001" in err
    assert main(["train", "--recipe", "tiny", "--steps", "20", "--print-config"]) == 0
    assert "warmup" not in capsys.readouterr().err


def test_a_training_run_notes_its_short_warmup_once(cache_dir, tmp_path, capsys):
    assert main(["train", "--recipe", "tiny", "--run-dir", str(tmp_path / "run"), "--seq-len", "32",
                 "--vocab-size", "300", "--max-train-bytes", "200000", "--cache-dir", str(cache_dir),
                 "--steps", "2", "--no-progress", "--no-plot", "--device", "cpu"]) == 0
    assert capsys.readouterr().err.count("note: --warmup-steps 20 is longer than --steps 2") == 1


@pytest.mark.parametrize("table, line, message", [
    ("model", 'tie_embeddings = "false"', r"\[model\] tie_embeddings must be bool, got str 'false'"),
    ("train", 'lr = "1e-3"', r"\[train\] lr must be float, got str '1e-3'"),
    ("train", "seq_len = true", r"\[train\] seq_len must be int, got bool True"),
    ("train", "steps = 2.0", r"\[train\] steps must be int, got float 2.0"),
    ("data", "max_train_bytes = [1]", r"\[data\] max_train_bytes must be int or None, got list"),
    ("train", "lr = inf", r"\[train\] lr must be a finite number"),
])
def test_recipe_types_are_checked(tmp_path, table, line, message):
    path = tmp_path / "typed.toml"
    path.write_text(f"[{table}]\n{line}\n")
    with pytest.raises(ValueError, match=f"recipe '{path}' {message}"):
        load_recipe(str(path))


def test_recipe_ints_are_floats(tmp_path):
    path = tmp_path / "ints.toml"
    path.write_text("[train]\nlr = 1\nphase_lr_scale = 0\n")
    train_cfg, _, _ = build_configs(load_recipe(str(path)))
    assert (train_cfg.lr, train_cfg.phase_lr_scale) == (1.0, 0.0)
    assert isinstance(train_cfg.lr, float)


# ---------------------------------------------------------------------------------------------
# a diverging run


def _nan_loss_at(monkeypatch, bad_step: int) -> None:
    real = torch.nn.functional.cross_entropy
    calls = {"training": 0}

    def cross_entropy(*args, **kwargs):
        loss = real(*args, **kwargs)
        if torch.is_grad_enabled():  # a training micro-batch (one per step here)
            calls["training"] += 1
            if calls["training"] == bad_step:
                return loss * math.nan
        return loss

    monkeypatch.setattr(torch.nn.functional, "cross_entropy", cross_entropy)


def _inf_grad_at(monkeypatch, bad_step: int) -> None:
    real = torch.nn.utils.clip_grad_norm_
    calls = {"n": 0}

    def clip(parameters, max_norm, *args, **kwargs):
        parameters = list(parameters)
        calls["n"] += 1
        if calls["n"] == bad_step:
            parameters[0].grad.view(-1)[0] = math.inf
        return real(parameters, max_norm, *args, **kwargs)

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", clip)


@pytest.mark.parametrize("inject", [_nan_loss_at, _inf_grad_at])
def test_non_finite_training_stops_without_a_checkpoint(inject, monkeypatch, cache_dir, tmp_path):
    run_dir = tmp_path / "diverged"
    inject(monkeypatch, bad_step=3)
    with pytest.raises(NonFiniteError, match="not finite at step 3"):
        train(*small_configs(run_dir, cache_dir, steps=6, log_every=2, save_every=2, eval_every=0))
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["latest", "step_000002"]
    assert [r["step"] for r in records(run_dir)] == [2]
    assert all(math.isfinite(x) for x in losses(run_dir))


# ---------------------------------------------------------------------------------------------
# logged loss across a resume off the log schedule


@pytest.fixture(scope="module")
def logged_run(tmp_path_factory, cache_dir):
    """8 steps, a record every 4, a checkpoint every 2 (all kept)."""
    run_dir = tmp_path_factory.mktemp("runs") / "logged"
    train(*small_configs(run_dir, cache_dir, steps=8, log_every=4, save_every=2, eval_every=0,
                         keep_checkpoints=4))
    return run_dir


def test_resume_off_the_log_schedule_logs_the_same_losses(logged_run, cache_dir, tmp_path):
    assert [r["step"] for r in records(logged_run)] == [4, 8]
    # stopped at step 6 (a record there marks the stop), then resumed
    stopped = tmp_path / "stopped"
    configs = dict(steps=8, log_every=4, save_every=2, eval_every=0, keep_checkpoints=4)
    train(*small_configs(stopped, cache_dir, stop_after=6, **configs))
    assert [r["step"] for r in records(stopped)] == [4, 6]
    train(*small_configs(stopped, cache_dir, resume=True, **configs))
    assert [r["step"] for r in records(stopped)] == [4, 8]
    assert losses(stopped) == losses(logged_run)  # bit for bit

    # killed after the checkpoint of step 6: the record of step 8 covers steps 5-8 all the same
    killed = tmp_path / "killed"
    shutil.copytree(logged_run, killed)
    shutil.rmtree(killed / "checkpoints" / "step_000008")
    (killed / "checkpoints" / "latest").write_text("step_000006\n")
    lines = (killed / "metrics.jsonl").read_text().splitlines(keepends=True)
    (killed / "metrics.jsonl").write_text(lines[0] + lines[1][:20])  # and a partial last line
    with pytest.warns(UserWarning, match="partial last line"):
        train(*small_configs(killed, cache_dir, resume=True, **configs))
    assert losses(killed) == losses(logged_run)


# ---------------------------------------------------------------------------------------------
# the run directory after kills, full disks and truncation


def _configs(run_dir, cache_dir, **train):
    return small_configs(run_dir, cache_dir, **{"steps": 4, "save_every": 2, "eval_every": 0, **train})


@pytest.fixture(scope="module")
def four_steps(tmp_path_factory, cache_dir):
    run_dir = tmp_path_factory.mktemp("runs") / "four"
    train(*_configs(run_dir, cache_dir))
    return run_dir


class _Killed(BaseException):
    """Stands for a SIGKILL: nothing in the trainer may catch it."""


def test_killed_first_checkpoint_restarts_or_resumes(four_steps, cache_dir, tmp_path, monkeypatch):
    run_dir = tmp_path / "killed"
    real_save = torch.save

    def killed_save(obj, path, *args, **kwargs):
        real_save(obj, path, *args, **kwargs)
        raise _Killed

    with monkeypatch.context() as patch:
        patch.setattr(torch, "save", killed_save)
        with pytest.raises(_Killed):
            train(*_configs(run_dir, cache_dir))
    assert list((run_dir / "checkpoints").glob(".tmp-*"))  # what a kill leaves behind
    assert not ckpt.has_checkpoint(run_dir)

    again = tmp_path / "again"
    shutil.copytree(run_dir, again)
    train(*_configs(again, cache_dir))  # started again without --resume
    assert losses(again) == losses(four_steps)
    assert not list((again / "checkpoints").glob(".tmp-*"))
    train(*_configs(run_dir, cache_dir, resume=True))  # or with it: from step 0
    assert losses(run_dir) == losses(four_steps)


@pytest.mark.parametrize("failure", [OSError(errno.ENOSPC, "No space left on device"),
                                     RuntimeError("[enforce fail at inline_container.cc:595] . "
                                                  "unexpected pos 320 vs 226")])
def test_full_disk_removes_the_partial_checkpoint(failure, four_steps, cache_dir, tmp_path,
                                                  monkeypatch):
    run_dir = tmp_path / "full"
    real_save = torch.save
    calls = {"n": 0}

    def save_on_a_filling_disk(obj, path, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] > 2:  # the first checkpoint (optimizer + rng) fits, the second does not
            with open(path, "wb") as handle:
                handle.write(b"partial")
            raise failure
        real_save(obj, path, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(torch, "save", save_on_a_filling_disk)
        with pytest.raises(ckpt.CheckpointWriteError,
                           match="checkpoint of step 4 .*(no space left|full disk).*still 'step_000002'"):
            train(*_configs(run_dir, cache_dir))
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["latest", "step_000002"]
    train(*_configs(run_dir, cache_dir, resume=True))  # space freed: the run completes
    assert losses(run_dir) == losses(four_steps)


def test_truncated_run_files(four_steps, cache_dir, tmp_path):
    run_dir = tmp_path / "truncated"
    shutil.copytree(four_steps, run_dir)
    config = run_dir / "config.json"
    config.write_text(config.read_text()[:200])
    message = "cannot read the run config '.*config.json': it is not valid JSON"
    with pytest.raises(ValueError, match=message):
        train(*_configs(run_dir, cache_dir, steps=6, resume=True))
    with pytest.raises(SystemExit, match=message):
        main(["train", "--run-dir", str(run_dir), "--resume"])

    broken = tmp_path / "broken-metrics"
    shutil.copytree(four_steps, broken)
    lines = (broken / "metrics.jsonl").read_text().splitlines(keepends=True)
    (broken / "metrics.jsonl").write_text(lines[0] + "{garbage\n" + "".join(lines[1:]))
    with pytest.raises(ValueError, match="metrics.jsonl' line 2 is not a JSON record"):
        train(*_configs(broken, cache_dir, steps=6, resume=True))


def test_resume_below_the_checkpoint_step_is_an_error(four_steps, tmp_path):
    run_dir = tmp_path / "ahead"
    shutil.copytree(four_steps, run_dir)
    with pytest.raises(SystemExit, match="checkpoint .* is at step 4, past --steps 3"):
        main(["train", "--run-dir", str(run_dir), "--resume", "--steps", "3", "--no-progress"])


def test_corpus_size_and_epochs_are_reported(four_steps, cache_dir):
    from tapa.data import build_corpus

    train_cfg, _, data_cfg = _configs(four_steps, cache_dir)
    tokens = len(build_corpus(data_cfg, progress=False).tokens("train"))
    plan = json.loads((four_steps / "config.json").read_text())["data_plan"]
    windows = (tokens - train_cfg.seq_len) // train_cfg.seq_len
    assert plan["train_tokens"] == tokens
    assert plan["epochs"] == pytest.approx(4 * train_cfg.batch_size / windows)
    assert records(four_steps)[-1]["epochs"] == pytest.approx(plan["epochs"])


def test_summary_of_a_run_with_one_logged_step(tmp_path):
    """With one logged step the summary said 'loss 5.908 -> 5.908', as if nothing trained."""
    from tapa.train.command import summary

    record = {"step": 10, "loss": 5.908, "tokens": 640, "elapsed_s": 2.0, "tokens_per_s": 320.0}
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "metrics.jsonl").write_text(json.dumps(record) + "\n")
    assert "steps 10: loss 5.908 at step 10, val_loss n/a, 320 tokens/s" in summary(tmp_path)
    first = {**record, "step": 1, "loss": 7.5}
    (tmp_path / "metrics.jsonl").write_text(json.dumps(first) + "\n" + json.dumps(record) + "\n")
    assert "steps 10: loss 7.500 -> 5.908, val_loss n/a" in summary(tmp_path)
