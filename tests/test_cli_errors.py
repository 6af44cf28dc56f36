"""A user's mistake ends in one line on stderr and exit status 1, never a traceback; --debug and
TAPA_DEBUG=1 show the traceback."""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import one_line_error as fail

from tapa.cli import main

SRC = Path(__file__).resolve().parents[1] / "src"


def test_missing_and_non_run_directories(tmp_path):
    fail(["eval", str(tmp_path / "missing")], "RUN_DIR .*missing' does not exist")
    fail(["eval", str(tmp_path)], "is not a training run directory .* and holds none")
    (tmp_path / "config.json").write_text("{}")  # a run that never saved a checkpoint
    fail(["eval", str(tmp_path)], "checkpoints/latest")
    (tmp_path / "config.json").write_text('{"model": {"di')  # a truncated config
    fail(["eval", str(tmp_path)], "config.json' is damaged")
    fail(["export", str(tmp_path / "missing"), str(tmp_path / "out")], "does not exist")
    fail(["report", str(tmp_path / "missing")], "no evaluation results")


def test_output_path_that_is_a_file(tmp_path):
    (tmp_path / "file").write_text("mine")
    fail(["theory", "--out", str(tmp_path / "file"), "--samples", "100"], "is a file")
    fail(["report", str(tmp_path), "--out", str(tmp_path / "file")], "is a file")
    assert (tmp_path / "file").read_text() == "mine"


def test_theory_refuses_a_folder_of_other_files_and_writes_under_runs_by_default(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    fail(["theory", "--out", str(tmp_path), "--samples", "100"],
         r"holds files tapa theory did not write \(notes.txt\).*--overwrite")
    from tapa.theory.command import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert str(parser.parse_args([]).out) == "runs/theory"
    assert "(default: runs/theory)" in parser.format_help()


def test_errors_of_every_user_kind_are_one_line(tmp_path, monkeypatch):
    import tapa.theory.command as theory
    from tapa.train.saving import CheckpointError

    for error in (PermissionError(13, "Permission denied", str(tmp_path / "x")),
                  IsADirectoryError(21, "Is a directory", str(tmp_path)),
                  CheckpointError("checkpoint file 'a/model.safetensors' is corrupt (sha256 mismatch)"),
                  ValueError("alpha must be > 0\nline two")):
        def raise_it(args, error=error):
            raise error
        monkeypatch.setattr(theory, "run", raise_it)
        message = fail(["theory"], ".")
        assert str(error).split("\n")[0] in message
    # a bug is not a user error: its traceback stays
    monkeypatch.setattr(theory, "run", lambda args: {}["missing"])
    with pytest.raises(KeyError):
        main(["theory"])


def test_debug_flag_and_variable_show_the_traceback(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="does not exist"):
        main(["eval", str(tmp_path / "missing"), "--debug"])
    with pytest.raises(ValueError, match="does not exist"):
        main(["--debug", "eval", str(tmp_path / "missing")])
    monkeypatch.setenv("TAPA_DEBUG", "1")
    with pytest.raises(ValueError, match="does not exist"):
        main(["eval", str(tmp_path / "missing")])


def test_from_a_shell(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    env.pop("TAPA_DEBUG", None)
    command = [sys.executable, "-m", "tapa", "eval", str(tmp_path / "missing")]
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.startswith("tapa eval: error: RUN_DIR") and result.stderr.count("\n") == 1


def test_help_lists_each_command_in_one_line_and_every_out_shows_its_default(capsys):
    from tapa.cli import COMMANDS

    assert main([]) == 2 and "commands:" in capsys.readouterr().out  # the full help, not a usage error
    with pytest.raises(SystemExit):
        main(["--help"])
    listing = capsys.readouterr().out.split("commands:\n")[1]
    for name in COMMANDS:
        described = [line for line in listing.splitlines() if line.split()[:1] == [name]]
        assert len(described) == 1 and len(described[0].split()) > 3, name
    for command in (["eval"], ["report"], ["theory"], ["demo"], ["bench", "attention"], ["bench", "decode"],
                    ["bench", "model"]):
        with pytest.raises(SystemExit):
            main([*command, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        out_help = text.split("--out OUT ")[1].split(" --")[0]  # the option, not the usage line
        assert "(default: " in out_help and "results/" not in out_help, (command, out_help)
    with pytest.raises(SystemExit):  # convert's model settings show what a conversion gets by default
        main(["convert", "--help"])
    options = {" ".join(entry.split()[:1]): " ".join(entry.split()) for entry in
               capsys.readouterr().out.split("\n  --")[1:]}  # each option's name -> its help
    for flag, default in (("local-window", "256"), ("pe", "tapa"), ("theta", "0.5"), ("alpha", "0.1"),
                          ("distance", "power"), ("phase", "quadratic"), ("phase-init-scale", "1.0")):
        assert f"(default: {default})" in options[flag], (flag, options[flag])


def test_results_json_of_another_kind_is_a_clear_error(tmp_path):
    (tmp_path / "results.json").write_text(json.dumps({"kind": "other"}))
    fail(["report", str(tmp_path), "--out", str(tmp_path / "out")], "is not a tapa eval results file")
    (tmp_path / "results.json").write_text("{trunc")
    fail(["report", str(tmp_path), "--out", str(tmp_path / "out")], "is not valid JSON")


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the no-CUDA errors")
@pytest.mark.parametrize("argv, message", [
    (["attention"], "tapa bench attention: error: needs a CUDA GPU"),
    (["varlen"], "tapa bench varlen: error: needs a CUDA GPU (the fused kernel is what it times)"),
    (["local", "--smoke", "--heads", "4", "--kv-heads", "3"],
     "tapa bench local: error: --heads (4) must be a multiple of --kv-heads (3)"),
    (["cp", "--cpu-smoke", "--lengths", "30", "--cp", "2"],
     "tapa bench cp: error: --lengths 30 under --cp 2: a row is cut into 2 x 2 = 4 equal chunks "
     "(head-tail load balancing), and 30 is not a multiple of 4"),
])
def test_bench_errors_are_one_error_line(argv, message, tmp_path):
    """Each benchmark spelled its own exit: 'tapa bench attention needs a CUDA GPU', 'tapa bench cp:
    --lengths ...', '--heads (4) must be ...' (no command at all), none with 'error:'. Each is now
    one `tapa bench NAME: error: ...` line."""
    if argv[0] in ("varlen", "cp"):
        argv = argv + (["--out", str(tmp_path / "v")] if argv[0] == "varlen" else ["--csv", str(tmp_path / "c")])
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", *argv])
    assert exit_info.value.code == message


def test_a_warning_is_one_line_naming_the_command():
    """A Python warning read '<string>:28: UserWarning: ModelConfig: theta=0.3 set, ...' (the
    dataclass's generated __init__ as its source), or a path into the package and the source line
    '  warnings.warn(' on a line of its own. It is now one line that names the command; --debug
    keeps Python's form, with the source. (A subprocess: pytest records warnings itself.)"""
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    env.pop("TAPA_DEBUG", None)
    command = [sys.executable, "-m", "tapa", "train", "--pe", "rope", "--theta", "0.3", "--print-config"]
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0 and result.stderr == (
        "tapa train: warning: ModelConfig: theta=0.3 set, but pe='rope' with layer_pattern='G' over "
        "3 layers has no global TAPA layer to read them; they are ignored\n")
    result = subprocess.run(command + ["--debug"], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0 and "UserWarning: ModelConfig: theta=0.3 set" in result.stderr


def test_under_torchrun_an_error_prints_once_per_launch_and_reaches_torchruns_report(tmp_path, monkeypatch, capsys):
    """Under torchrun every rank fails alike on a bad flag: the line prints once per launch (on one
    host), names the rank that printed it, and goes to the rank's torchrun error file, whose message
    torchrun's closing report shows. A different line (a rank-specific failure) still prints."""
    import tempfile

    from tapa._torchrun import error_for_this_process

    assert error_for_this_process("tapa x: error: a") == "tapa x: error: a"  # not under torchrun
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "launch-1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    for rank in (1, 0):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(tmp_path / f"error{rank}.json"))
        with pytest.raises(SystemExit) as exit_:
            main(["train", "--no-such-flag"])
        assert exit_.value.code == 2
        recorded = json.loads((tmp_path / f"error{rank}.json").read_text())["message"]
        assert recorded.startswith("tapa train: error: unrecognized arguments: --no-such-flag")
    # rank 1 printed it, tagged; rank 0, failing the same way, printed nothing
    assert capsys.readouterr().err.splitlines() == [f"{recorded} [rank 1 of 2]"]
    assert error_for_this_process("tapa x: error: b") == "tapa x: error: b [rank 0 of 2]"
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "launch-2")  # another launch prints its own
    assert error_for_this_process("tapa x: error: b") == "tapa x: error: b [rank 0 of 2]"
    # a command's own error (train's configuration check) goes the same way
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "launch-3")
    with pytest.raises(SystemExit) as exit_:
        main(["train", "--recipe", "tiny", "--cp", "2", "--seq-len", "102", "--run-dir", str(tmp_path / "r")])
    assert exit_.value.code.startswith("tapa train: error: seq_len (102) must be a multiple of 2 x cp")
    assert exit_.value.code.endswith("[rank 0 of 2]")
    with pytest.raises(SystemExit) as exit_:
        main(["train", "--recipe", "tiny", "--cp", "2", "--seq-len", "102", "--run-dir", str(tmp_path / "r")])
    assert exit_.value.code == 1
