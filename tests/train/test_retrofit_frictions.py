"""The frictions of issue 38 on the retrofit path, each with its check."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tapa.cli import main as tapa_main
from tapa.data import DataConfig
from tapa.model import ModelConfig
from tapa.train.config import TrainConfig, default_run_dir

ROOT = Path(__file__).resolve().parents[2]
FLAGS = ["--seq-len", "32", "--batch-size", "2", "--steps", "2", "--warmup-steps", "1", "--eval-every", "2",
         "--eval-batches", "1", "--save-every", "2", "--log-every", "1", "--device", "cpu", "--no-plot",
         "--dim", "32", "--n-layers", "2", "--n-heads", "2", "--vocab-size", "300", "--max-train-bytes", "200000"]


def test_default_run_names_include_the_data_source():
    train, model = TrainConfig(name="tiny", seq_len=256), ModelConfig(dim=32, n_layers=2, n_heads=2)
    assert default_run_dir(train, model) == Path("runs/tiny-tapa-256")
    assert default_run_dir(train, model, DataConfig()) == Path("runs/tiny-tapa-256")  # builtin: as before
    assert default_run_dir(train, model, DataConfig(source="~/text/my notes.txt")) == \
        Path("runs/tiny-tapa-256-my-notes.txt")
    assert default_run_dir(train, model, DataConfig(source="hf:wikitext")) == Path("runs/tiny-tapa-256-hf-wikitext")
    assert default_run_dir(train, model, DataConfig(source="corpus/a")) != \
        default_run_dir(train, model, DataConfig(source="corpus/b"))


def test_usage_and_train_errors_are_one_line_with_error_prefix(capsys):
    with pytest.raises(SystemExit) as exit_info:
        tapa_main(["train", "--no-such-flag"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1 and err.startswith("tapa train: error: ")
    with pytest.raises(SystemExit, match=r"^tapa train: error: lr must be a finite number, got inf[^\n]*$"):
        tapa_main(["train", "--lr", "inf"])


def test_gitignore_lists_exported_and_reports():
    lines = (ROOT / ".gitignore").read_text().split()
    assert "/exported/" in lines and "/reports/" in lines


def test_summary_resume_of_a_finished_run_and_passkey_table(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TAPA_CACHE", str(tmp_path / "cache"))
    run = tmp_path / "run"
    assert tapa_main(["train", "--run-dir", str(run), "--progress", *FLAGS]) == 0
    out = capsys.readouterr().out
    assert out.count("corpus:") == 1, out  # printed at the start, not again in the summary
    val = re.search(r"val_loss (\S+),", out).group(1)
    assert re.fullmatch(r"\d+\.\d{3}", val), out
    # --resume of a finished run: says it is complete, trains nothing, rewrites nothing
    metrics = (run / "metrics.jsonl").read_text()
    assert tapa_main(["train", "--run-dir", str(run), "--resume", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"tapa train: .*run is complete: its latest checkpoint is at step 2 of --steps 2; "
                     r"nothing to resume", out), out
    assert "val_loss" not in out and (run / "metrics.jsonl").read_text() == metrics
    # passkey: the table is printed, and a grid of zeros from a model never trained on it has a note
    assert tapa_main(["eval", str(run), "--lengths", "32", "--max-tokens", "64", "--passkey",
                      "--passkey-lengths", "256", "--passkey-depths", "0.5", "--passkey-trials", "2",
                      "--device", "cpu", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "passkey retrieval:" in out and "| depth | 256 |" in out
    grid = json.loads((run / "eval" / "results.json").read_text())["methods"][0]["passkey"]
    if not any(any(row) for row in grid["correct"]):
        assert "note: every passkey cell is 0: run was never trained on passkey prompts" in out


def test_passkey_note_only_for_zeros_of_a_model_never_trained_on_passkeys(tmp_path):
    from tapa.eval.command import passkey_note

    (tmp_path / "config.json").write_text(json.dumps({"train": {"passkey_fraction": 0.0}}))
    assert "never trained" in passkey_note({"correct": [[0, 0]]}, tmp_path, False)
    assert passkey_note({"correct": [[0, 1]]}, tmp_path, False) is None
    assert "may never have been trained" in passkey_note({"correct": [[0]]}, tmp_path, True)
    (tmp_path / "config.json").write_text(json.dumps({"train": {"passkey_fraction": 0.1}}))
    assert passkey_note({"correct": [[0, 0]]}, tmp_path, False) is None
