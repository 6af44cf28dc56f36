"""`tapa train` end to end on the built-in corpus: pretrain, then continue at twice the length."""

import io
import json
import sys

import pytest
from trainkit import records, one_thread  # noqa: F401 (autouse fixture)

from tapa.cli import main


def _common(cache_dir):
    return ["--recipe", "tiny", "--cache-dir", str(cache_dir), "--vocab-size", "300",
            "--max-train-bytes", "200000", "--dim", "32", "--n-layers", "2", "--n-heads", "2",
            "--batch-size", "4", "--log-every", "1", "--eval-batches", "1", "--no-progress",
            "--no-plot", "--device", "cpu"]


def test_pretrain_then_continual_at_twice_the_length(cache_dir, tmp_path, capsys):
    pre = tmp_path / "pre"
    assert main(["train", *_common(cache_dir), "--seq-len", "32", "--steps", "30", "--lr", "1e-2",
                 "--warmup-steps", "3", "--eval-every", "15", "--run-dir", str(pre)]) == 0
    assert f"run: {pre}" in capsys.readouterr().out
    losses = [r["loss"] for r in records(pre)]
    assert max(losses[-5:]) < min(losses[:3]) - 0.5  # the loss falls
    vals = [r["val_loss"] for r in records(pre) if r["val_loss"] is not None]
    assert len(vals) == 2 and vals[1] < vals[0]

    cont = tmp_path / "cont"
    assert main(["train", *_common(cache_dir), "--init-from", str(pre), "--seq-len", "64",
                 "--steps", "3", "--eval-every", "0", "--run-dir", str(cont)]) == 0
    config = json.loads((cont / "config.json").read_text())
    assert config["train"]["seq_len"] == 64 and config["init_from"].endswith("step_000030")
    # a fresh optimizer at the pretraining peak lr undoes pretraining: by default the continual
    # run takes the lr where the schedule ended (here the repeated recipe's lr 1e-3 x
    # min_lr_ratio 0.1; without a recipe the source run's, below); --lr overrides
    assert config["train"]["lr"] == pytest.approx(1e-4)
    assert "continual run: peak lr 0.0001, where the pretraining schedule ended" in capsys.readouterr().out
    # --print-config's stdout is JSON alone (the lr note went before it there, so json.loads failed)
    assert main(["train", *_common(cache_dir), "--init-from", str(pre), "--seq-len", "64",
                 "--print-config"]) == 0
    printed = capsys.readouterr()
    assert json.loads(printed.out)["train"]["lr"] == pytest.approx(1e-4)
    assert "continual run: peak lr 0.0001" in printed.err
    chosen = tmp_path / "chosen-lr"
    assert main(["train", *_common(cache_dir), "--init-from", str(pre), "--seq-len", "64", "--lr", "5e-3",
                 "--steps", "1", "--eval-every", "0", "--run-dir", str(chosen)]) == 0
    assert json.loads((chosen / "config.json").read_text())["train"]["lr"] == 5e-3
    assert "continual run" not in capsys.readouterr().out
    assert main(["train", "--run-dir", str(cont), "--resume", "--steps", "4", "--no-progress"]) == 0
    config = json.loads((cont / "config.json").read_text())
    assert config["init_from"].endswith("step_000030") and records(cont)[-1]["step"] == 4
    assert records(cont)[0]["loss"] < losses[0] - 0.5  # continues from the trained weights

    # TAPA's settings are fixed by the checkpoint: a clear message, no run
    with pytest.raises(SystemExit, match="keeps the checkpoint's alpha"):
        main(["train", *_common(cache_dir), "--init-from", str(pre), "--seq-len", "64",
              "--alpha", "0.2", "--run-dir", str(tmp_path / "bad")])
    assert not (tmp_path / "bad").exists()


def test_rope_continual_may_change_its_scaling(cache_dir, tmp_path):
    pre = tmp_path / "rope"
    assert main(["train", *_common(cache_dir), "--pe", "rope", "--seq-len", "32", "--steps", "2",
                 "--eval-every", "0", "--run-dir", str(pre)]) == 0
    cont = tmp_path / "yarn"
    assert main(["train", *_common(cache_dir), "--pe", "rope-yarn", "--rope-scale", "2",
                 "--original-seq-len", "32", "--init-from", str(pre), "--seq-len", "64",
                 "--steps", "1", "--eval-every", "0", "--run-dir", str(cont)]) == 0
    model = json.loads((cont / "config.json").read_text())["model"]
    assert (model["pe"], model["rope_scale"], model["original_seq_len"]) == ("rope-yarn", 2.0, 32)


def test_resume_from_the_command_line(cache_dir, tmp_path):
    run_dir = tmp_path / "run"
    args = [*_common(cache_dir), "--seq-len", "32", "--steps", "4", "--eval-every", "0",
            "--run-dir", str(run_dir)]
    assert main(["train", *args, "--stop-after", "2"]) == 0
    assert main(["train", "--run-dir", str(run_dir), "--resume", "--no-progress"]) == 0
    assert [r["step"] for r in records(run_dir)] == [1, 2, 3, 4]
    with pytest.raises(SystemExit, match="not found"):
        main(["train", "--run-dir", str(tmp_path / "missing"), "--resume"])


def test_data_only_builds_the_cache(tmp_path, capsys):
    cache_dir = tmp_path / "cache"
    assert main(["train", *_common(cache_dir), "--data-only"]) == 0
    out = capsys.readouterr().out
    assert "data cache:" in out and "vocab 300" in out
    assert any(cache_dir.iterdir())


def test_init_from_takes_the_model_from_the_checkpoint(cache_dir, tmp_path):
    pre = tmp_path / "pre"
    assert main(["train", *_common(cache_dir), "--seq-len", "32", "--steps", "2", "--lr", "2e-3",
                 "--eval-every", "0", "--run-dir", str(pre)]) == 0
    # no recipe repeated: model, data and train settings come from the run it continues
    cont = tmp_path / "cont"
    assert main(["train", "--init-from", str(pre), "--seq-len", "64", "--steps", "1",
                 "--run-dir", str(cont), "--no-progress", "--no-plot"]) == 0
    source, config = (json.loads((d / "config.json").read_text()) for d in (pre, cont))
    assert config["model"] == source["model"] and config["data"] == source["data"]
    # the lr where the source's schedule ended: its 2e-3 x min_lr_ratio 0.1
    assert config["train"]["lr"] == pytest.approx(2e-4)
    assert (config["train"]["seq_len"], config["train"]["steps"]) == (64, 1)
    assert config["train"]["resume"] is False and config["init_from"].endswith("step_000002")
    assert config["train"]["name"] == source["train"]["name"] + "-continual"
    with pytest.raises(SystemExit, match="keeps the checkpoint's dim=32; got dim=64"):
        main(["train", "--init-from", str(pre), "--dim", "64", "--run-dir", str(tmp_path / "bad")])
    # the global layers' query temperature has no weights: a continual stage may add it
    tempered = tmp_path / "tempered"
    assert main(["train", "--init-from", str(pre), "--seq-len", "64", "--steps", "1", "--query-temperature-base",
                 "32", "--run-dir", str(tempered), "--no-progress", "--no-plot"]) == 0
    model = json.loads((tempered / "config.json").read_text())["model"]
    assert model == {**source["model"], "query_temperature_base": 32}


def test_progress_off_a_terminal_is_plain_lines(cache_dir, tmp_path, capfd, monkeypatch):
    """With progress on and stderr not a terminal (a log file, a pipe, CI), training draws no bar
    (tqdm's carriage returns filled the device's logs with a line per redraw) but says where it is:
    one plain line at the last step, and one at a logged step every 30 s between. On a terminal
    the bar, and no plain line."""
    import tapa.train.trainer as trainer

    argv = [arg for arg in _common(cache_dir) if arg != "--no-progress"]
    assert main(["train", *argv, "--progress", "--seq-len", "32", "--steps", "4", "--eval-every", "0",
                 "--run-dir", str(tmp_path / "quiet")]) == 0
    err = capfd.readouterr().err
    assert "\r" not in err and "%|" not in err, err
    lines = [line for line in err.splitlines() if line.startswith("train tapa L=32: ")]
    assert lines == [lines[-1]] and lines[-1].startswith("train tapa L=32: step 4/4, loss "), err

    monkeypatch.setattr(trainer._Progress, "every", 0.0)  # a line at every logged step
    assert main(["train", *argv, "--progress", "--seq-len", "32", "--steps", "4", "--eval-every", "0",
                 "--run-dir", str(tmp_path / "every")]) == 0
    steps = [line.split(",")[0] for line in capfd.readouterr().err.splitlines() if line.startswith("train ")]
    assert steps == [f"train tapa L=32: step {step}/4" for step in (1, 2, 3, 4)]

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)  # on a terminal: the bar, no plain lines
    assert main(["train", *argv, "--progress", "--seq-len", "32", "--steps", "4", "--eval-every", "0",
                 "--run-dir", str(tmp_path / "terminal")]) == 0
    drawn = terminal.getvalue()
    assert "4/4" in drawn and "%|" in drawn and "step 4/4" not in drawn, drawn
