"""Issue 34, the command-line cases: the output rule inside run directories (case 2), checkpoints
whose weights are not finite (3), a swapped tokenizer in the token cache (4), --device cuda on a
machine without CUDA for every subcommand (7), --tokenizer that is not one (8), and a checkpoint
pruned while eval reads it (12). Each failed, or gave a silently wrong result, before its fix."""

import json
import re
import shutil

import pytest
import torch

from helpers import one_line_error as one_line, tiny_run

from tapa.cli import COMMANDS, main

FAST = ["--lengths", "16,32", "--stride", "16", "--max-tokens", "32", "--no-progress", "--device", "cpu"]


def _train(root, name, **train):
    return tiny_run(root, name, **{"save_every": 1, "keep_checkpoints": 2, **train})


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A 2-step run with a checkpoint at each step (step_000001, step_000002)."""
    return _train(tmp_path_factory.mktemp("safety"), "run")


def _files(path):
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


# ---------------------------------------------------------------------------------------------
# case 2: nothing writes inside a run directory


def test_no_command_writes_inside_a_run_directory(run_dir, tmp_path):
    pytest.importorskip("transformers")
    step = run_dir / "checkpoints" / "step_000001"
    before = _files(run_dir)
    refused = "is inside the training run directory"
    for flags in ([], ["--overwrite"]):
        one_line(["export", str(run_dir), str(step), *flags], refused)
        one_line(["export", str(run_dir), str(run_dir / "checkpoints"), *flags], refused)
        one_line(["export", str(run_dir), str(step / "hf"), *flags], refused)
        one_line(["eval", str(run_dir), "--out", str(step), *flags, *FAST], refused)
        one_line(["eval", str(run_dir), "--out", str(run_dir / "checkpoints"), *flags, *FAST], refused)
        one_line(["report", str(run_dir), "--out", str(step), *flags], refused)
        one_line(["theory", "--out", str(step), "--samples", "100", *flags], refused)
        one_line(["theory", "--out", str(run_dir / "notes"), "--samples", "100", *flags], refused)
    # tapa demo wrote its runs, tables and plots into a run directory, and --force deleted any
    # rope/, tapa/ or hybrid/ folder there
    for flags in ([], ["--force"]):
        one_line(["demo", "--tiny", "--device", "cpu", "--out", str(run_dir), *flags],
                 "is a training run directory")
        one_line(["demo", "--tiny", "--device", "cpu", "--out", str(step), *flags], refused)
    llama = tmp_path / "llama"
    llama.mkdir()
    for flags in ([], ["--overwrite"]):
        one_line(["convert", str(llama), str(step), *flags], refused)
    assert _files(run_dir) == before
    # the run's own evaluation folder stays eval's to write (RUN/eval, RUN/eval-<data>)
    assert main(["eval", str(run_dir), *FAST]) == 0
    assert (run_dir / "eval" / "results.json").is_file()
    shutil.rmtree(run_dir / "eval")


# ---------------------------------------------------------------------------------------------
# case 3: a checkpoint whose weights are not finite


def _poison(checkpoint):
    """NaN in one weight, with the sha256 in state.json updated (a run that saved diverged weights)."""
    from safetensors.torch import load_file, save_file

    from tapa._paths import file_sha256

    weights = load_file(checkpoint / "model.safetensors")
    name = sorted(weights)[0]
    weights[name] = weights[name].clone()
    weights[name].view(-1)[0] = float("nan")
    save_file(weights, checkpoint / "model.safetensors")
    state = json.loads((checkpoint / "state.json").read_text())
    state["sha256"]["model.safetensors"] = file_sha256(checkpoint / "model.safetensors")
    (checkpoint / "state.json").write_text(json.dumps(state))


def test_eval_and_export_refuse_weights_that_are_not_finite(tmp_path):
    pytest.importorskip("transformers")
    run = _train(tmp_path, "diverged")
    _poison(run / "checkpoints" / "step_000002")
    one_line(["eval", str(run), *FAST], r"step 2 .* holds weights that are not finite \(nan or inf in ")
    one_line(["export", str(run), str(tmp_path / "hf")], "holds weights that are not finite")
    assert not (run / "eval").exists() and not (tmp_path / "hf").exists()
    # the checkpoint before it is fine
    assert main(["eval", str(run), "--checkpoint", str(run / "checkpoints" / "step_000001"), *FAST]) == 0


# ---------------------------------------------------------------------------------------------
# case 4: the cached tokenizer is checked like the token arrays


def test_a_swapped_tokenizer_in_the_cache_stops_the_passkey_eval(tmp_path):
    from tapa.data import DataConfig, find_corpus

    run = _train(tmp_path, "run")
    corpus = find_corpus(DataConfig.from_dict(json.loads((run / "config.json").read_text())["data"]))
    path = corpus.tokenizer_dir / "tokenizer.json"
    tokenizer = json.loads(path.read_text())
    vocab = tokenizer["model"]["vocab"]
    a, b = sorted(vocab)[40], sorted(vocab)[41]
    vocab[a], vocab[b] = vocab[b], vocab[a]  # same size, two ids swapped
    path.write_text(json.dumps(tokenizer))
    passkey = ["--passkey", "--passkey-lengths", "256", "--passkey-depths", "0.5", "--passkey-trials", "1"]
    one_line(["eval", str(run), *passkey, *FAST],
             rf"tokenizer.json is missing or does not match the sha256 .*delete {re.escape(str(corpus.directory))}")
    assert not (run / "eval").exists()


# ---------------------------------------------------------------------------------------------
# case 7: --device cuda without CUDA, every subcommand


@pytest.fixture
def no_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)


@pytest.mark.parametrize("device", ["cuda", "cuda:0", "foo"])
def test_eval_on_a_device_this_machine_lacks_is_one_line(run_dir, no_cuda, device):
    expected = "not a device name" if device == "foo" else "CUDA is not available on this machine"
    one_line(["eval", str(run_dir), *FAST[:-2], "--device", device], f"--device '{device}'.*{expected}")
    assert not (run_dir / "eval").exists()


# every subcommand's arguments but --device (the bench benchmarks take theirs after the name)
SUBCOMMANDS = {
    "demo": lambda run, out: ["demo", "--tiny", "--out", str(out / "demo")],
    "theory": lambda run, out: ["theory", "--out", str(out / "theory"), "--samples", "100"],
    "data": lambda run, out: ["data", "build", "--cache-dir", str(out / "cache")],
    "train": lambda run, out: ["train", "--run-dir", str(out / "train"), "--steps", "1"],
    "eval": lambda run, out: ["eval", str(run)],
    "report": lambda run, out: ["report", str(run), "--out", str(out / "report")],
    "export": lambda run, out: ["export", str(run), str(out / "hf")],
    "convert": lambda run, out: ["convert", str(out / "llama"), str(out / "converted")],
    **{f"bench {name}": (lambda name: lambda run, out: ["bench", name])(name)
       for name in ("attention", "model", "decode", "generate", "varlen", "local")},
}


def test_every_subcommand_with_device_cuda_without_cuda(run_dir, tmp_path, no_cuda, capsys):
    """Each ends at once in one error line and writes nothing: the commands that take --device
    say CUDA is not available (exit 1), the others that they take no --device (a usage error, exit
    status 2)."""
    assert {key.split()[0] for key in SUBCOMMANDS} == set(COMMANDS)
    (tmp_path / "llama").mkdir()
    for key, argv_of in SUBCOMMANDS.items():
        argv = [*argv_of(run_dir, tmp_path), "--device", "cuda"]
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        code = exit_info.value.code
        err = capsys.readouterr().err
        assert "Traceback" not in err, (key, err)
        if isinstance(code, str):  # a command with --device: one line, exit status 1
            assert "\n" not in code and re.search(r"'cuda'.*CUDA is not available", code), (key, code)
            assert code.startswith(f"tapa {argv[0]}: "), (key, code)
        else:  # a usage error: one line too, with argparse's exit status 2
            assert code == 2, (key, code)
            assert err.count("\n") == 1 and re.match(rf"tapa {argv[0]}: error: unrecognized arguments: --device cuda",
                                                     err), (key, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["llama"]  # nothing written, no cache built
    assert not (run_dir / "eval").exists()


# ---------------------------------------------------------------------------------------------
# case 8: --tokenizer that is not a tokenizer


def test_export_with_a_text_file_as_tokenizer_is_one_line(run_dir, tmp_path):
    pytest.importorskip("transformers")
    text = tmp_path / "notes.txt"
    text.write_text("just some text\n")
    one_line(["export", str(run_dir), str(tmp_path / "hf"), "--tokenizer", str(text)],
             r"--tokenizer '.*notes.txt' is not a tokenizer: .* does not load as a tokenizers tokenizer.json")
    assert not (tmp_path / "hf").exists()


# ---------------------------------------------------------------------------------------------
# case 12: a checkpoint pruned while eval reads it


def _save_and_prune(run_dir, checkpoint):
    """What a trainer with keep_checkpoints=1 does between eval's choosing a checkpoint and its
    reading it: write the next checkpoint, point latest at it, remove the old one."""
    newer = checkpoint.parent / "step_000004"
    shutil.copytree(checkpoint, newer)
    (checkpoint.parent / "latest").write_text("step_000004\n")
    shutil.rmtree(checkpoint)


def test_eval_reads_a_checkpoint_that_is_pruned_mid_read(tmp_path, monkeypatch):
    import tapa.model.loading as loading

    run = _train(tmp_path, "run")
    step = run / "checkpoints" / "step_000002"
    real = loading.file_sha256
    pruned = []

    def sha256_while_training(path):  # the trainer prunes just as eval starts reading
        if not pruned:
            pruned.append(path)
            _save_and_prune(run, step)
        return real(path)

    monkeypatch.setattr(loading, "file_sha256", sha256_while_training)
    assert main(["eval", str(run), *FAST]) == 0
    assert pruned and not step.exists()
    assert json.loads((run / "eval" / "results.json").read_text())["methods"]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["latest", "step_000001", "step_000004"]


def test_eval_moves_to_the_newest_checkpoint_when_its_own_is_gone(tmp_path, monkeypatch, capsys):
    import tapa.eval.command as command

    run = _train(tmp_path, "run")
    step = run / "checkpoints" / "step_000002"
    real = command.checkpoint_of

    def chosen_then_pruned(run_dir, checkpoint):
        chosen = real(run_dir, checkpoint)
        if step.exists():  # the first choice is pruned at once
            _save_and_prune(run, step)
        return chosen

    monkeypatch.setattr(command, "checkpoint_of", chosen_then_pruned)
    assert main(["eval", str(run), *FAST]) == 0
    assert "step_000002 of" in capsys.readouterr().err
    # an explicit --checkpoint that is gone by the time it is read is an error instead
    gone = run / "checkpoints" / "step_000003"
    monkeypatch.setattr(command, "checkpoint_of", lambda run_dir, checkpoint: gone)
    one_line(["eval", str(run), "--checkpoint", str(run / "checkpoints" / "step_000001"), *FAST],
             "step_000003' was removed before it could be read")


@pytest.mark.slow
def test_eval_beside_a_trainer_that_prunes_every_step(tmp_path):
    """The issue's case: `tapa eval` five times while `tapa train --save-every 1` keeps one
    checkpoint (a new one, and a pruned one, every few tens of milliseconds)."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    run = tmp_path / "run"
    argv = ["train", "--recipe", "tiny", "--run-dir", str(run), "--seq-len", "32", "--vocab-size", "300",
            "--max-train-bytes", "200000", "--cache-dir", str(tmp_path / "cache"), "--no-progress", "--no-plot",
            "--device", "cpu", "--steps", "100000", "--save-every", "1", "--keep-checkpoints", "1",
            "--log-every", "1", "--eval-every", "0"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src"), "OMP_NUM_THREADS": "1"}
    trainer = subprocess.Popen([sys.executable, "-m", "tapa", *argv], env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 180
        while not (run / "checkpoints" / "latest").exists():
            assert trainer.poll() is None and time.monotonic() < deadline, trainer.stderr.read()
            time.sleep(0.1)
        for attempt in range(5):
            assert main(["eval", str(run), "--out", str(tmp_path / f"eval{attempt}"), *FAST]) == 0
        assert trainer.poll() is None  # it trained (and pruned) throughout
    finally:
        trainer.send_signal(signal.SIGKILL)
        trainer.wait()
    assert not list((run / "checkpoints").glob(".pin-*"))
