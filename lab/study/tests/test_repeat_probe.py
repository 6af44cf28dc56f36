"""lab/study/repeat_probe.py: gpu_repeat_probe.sh's arm flags and its comparison of two runs."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lab.study.repeat_probe import arm_flags, compare_curves, main, summary_row


def _run(tmp_path, name, losses):
    run = tmp_path / name
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(
        json.dumps({"step": 10 * (i + 1), "loss": loss, "tokens_per_s": 1000.0 * (i + 1)}) + "\n"
        for i, loss in enumerate(losses)))
    return run


def test_compare_curves_finds_the_first_differing_step_and_the_largest_difference():
    first = [{"step": 10, "loss": 5.0}, {"step": 20, "loss": 4.0}, {"step": 30, "loss": 3.0}]
    second = [{"step": 10, "loss": 5.0}, {"step": 20, "loss": 4.25}, {"step": 30, "loss": 2.5}]
    assert compare_curves(first, second) == {"logged": 3, "logged_each": (3, 3),
                                             "first_differing_step": 20, "max_abs_difference": 0.5}
    same = compare_curves(first, [dict(row) for row in first])
    assert same["first_differing_step"] is None and same["max_abs_difference"] == 0.0


def test_compare_curves_pairs_rows_by_step_not_by_position():
    # a validation row without a loss, or a step one run logged and the other did not, must not
    # shift the pairing
    first = [{"step": 10, "loss": 5.0}, {"step": 15, "val_loss": 4.9}, {"step": 20, "loss": 4.0}]
    second = [{"step": 10, "loss": 5.0}, {"step": 20, "loss": 4.0}, {"step": 30, "loss": 3.0}]
    assert compare_curves(first, second) == {"logged": 2, "logged_each": (2, 3),
                                             "first_differing_step": None, "max_abs_difference": 0.0}


def test_summary_row_reads_two_run_directories(tmp_path):
    a = _run(tmp_path, "a", [5.0, 4.0, 3.0])
    b = _run(tmp_path, "b", [5.0, 4.0, 3.5])
    row = summary_row("hybrid-nope", "default", [a, b])
    assert row.startswith("| hybrid-nope | default | 3 | 30 | 0.5 |")
    assert "none (bitwise equal)" in summary_row("rope", "default", [a, a])


def test_summary_row_says_when_a_run_left_no_losses(tmp_path):
    # a failed run (no metrics.jsonl) is not "bitwise equal"
    a = _run(tmp_path, "a", [5.0, 4.0])
    row = summary_row("hybrid-tapa", "default", [a, tmp_path / "missing"])
    assert "bitwise" not in row and "no losses to compare" in row
    # a run cut short compares equal over the steps it reached, and the row says it stopped early
    short = _run(tmp_path, "short", [5.0, 4.0])
    long = _run(tmp_path, "long", [5.0, 4.0, 3.0])
    assert "logged 2 and 3 steps: one stopped early" in summary_row("rope", "default", [short, long])


def test_arm_flags_are_the_study_runners_and_unknown_arms_are_refused(capsys):
    flags = arm_flags("hybrid-tapa", 0.001)
    assert flags[:2] == ["--pe", "tapa"] and "LLLG" in flags and flags[-2:] == ["--lr", "0.001"]
    # placeholders are filled from the protocol (the temperature's base is its training length)
    temp = arm_flags("hybrid-nope-temp", 0.001)
    assert temp[temp.index("--query-temperature-base") + 1] == "512"
    with pytest.raises(ValueError, match="unknown arm 'hybrid-nop'"):
        arm_flags("hybrid-nop", 0.001)
    with pytest.raises(SystemExit):
        main(["flags", "hybrid-nop", "0.001"])
    assert "unknown arm" in capsys.readouterr().err
    assert arm_flags("rope", 2e-3) == ["--pe", "rope", "--lr", "0.002"]
    # the protocol's model comes first, as in the runner's pretraining command (the tiny protocol's
    # 4 layers, which the hybrids' LLLG needs)
    assert arm_flags("hybrid-nope", 1e-3, "tiny-cpu")[:6] == ["--dim", "32", "--n-layers", "4", "--n-heads", "2"]


def test_protocol_field_gives_the_recipe_and_the_data_flags(capsys):
    from lab.study.arms import PROTOCOLS
    from lab.study.repeat_probe import protocol_field
    assert protocol_field("toy-gpu", "recipe") == PROTOCOLS["toy-gpu"].recipe
    assert protocol_field("toy-gpu", "data") == "--max-train-bytes 400000000 --tokenizer-train-bytes 50000000"
    assert main(["protocol", "tiny-cpu", "recipe"]) == 0
    assert capsys.readouterr().out.strip() == PROTOCOLS["tiny-cpu"].recipe
    with pytest.raises(ValueError, match="recipe or data"):
        protocol_field("toy-gpu", "model")


def _probe(tmp_path, **env):
    """gpu_repeat_probe.sh run from the repository root with this Python first on PATH (the script
    calls python3) and its summary under tmp_path/out."""
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    return subprocess.run(["bash", "lab/study/gpu_repeat_probe.sh"], cwd=Path(__file__).resolve().parents[3],
                          env=dict(os.environ, PATH=path, OUT=str(tmp_path / "out"), **env),
                          capture_output=True, text=True, timeout=600)


@pytest.mark.slow  # trains a tiny NoPE hybrid four times on CPU (~40 s)
def test_the_probe_script_runs_each_mode_twice(tmp_path):
    """gpu_repeat_probe.sh end to end on the tiny CPU protocol: `deterministic` passes
    --deterministic, `warn-only` also turns torch's warn-only mode on before tapa train (which keeps
    it; tests/train/test_train_deterministic.py checks that it does), and each pair's row lands in
    the summary."""
    done = _probe(tmp_path, PROTOCOL="tiny-cpu", STEPS="2", ARMS="hybrid-nope", MODES="deterministic warn-only")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    rows = [line for line in (tmp_path / "out" / "summary.md").read_text().splitlines()
            if line.startswith("| hybrid-nope |")]
    assert [row.split(" | ")[1] for row in rows] == ["deterministic", "warn-only"]
    assert all("bitwise equal" in row for row in rows), rows
    assert "copy 2: rc 0" in done.stdout and "rc 1" not in done.stdout


def test_the_probe_script_refuses_an_unknown_mode_before_any_work(tmp_path):
    done = _probe(tmp_path, MODES="default strict")
    assert done.returncode == 2 and "unknown mode 'strict'" in done.stderr
    assert not (tmp_path / "out" / "summary.md").exists()
