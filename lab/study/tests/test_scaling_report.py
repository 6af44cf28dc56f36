"""lab/study/scaling_report.py (scripts/multi_gpu_check.sh's summary) on run directories written
here: the throughput ratio and the loss gap against the 1-GPU run, the resumed runs' gap against
the uninterrupted one, and the files it writes. (tests/train/test_train_distributed.py runs real
torchrun processes; this checks the report's arithmetic alone.)"""

import json

import pytest

from lab.study.scaling_report import RUN_NAME, collect, main, report


def _run(root, name, losses, tokens_per_s, seq_len=32, device="cpu"):
    run = root / name
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"num_parameters": 1_234_567, "device": device,
                                                 "train": {"seq_len": seq_len}}))
    (run / "metrics.jsonl").write_text("".join(
        json.dumps({"step": step, "loss": loss, "tokens_per_s": rate}) + "\n"
        for step, (loss, rate) in enumerate(zip(losses, tokens_per_s), start=1)))
    return run


def test_run_names():
    assert RUN_NAME.match("toy-gpu-fsdp-2").group("recipe", "mode", "gpus", "resumed") == \
        ("toy-gpu", "fsdp", "2", None)
    assert RUN_NAME.match("small-ddp-2-resume1")["resumed"] == "1"
    assert RUN_NAME.match("small-zero-2") is None


def test_report_ratio_gap_and_resume(tmp_path):
    root = tmp_path / "runs"
    _run(root, "small-ddp-1", [3.0, 2.5, 2.0], [900.0, 100.0, 100.0])
    _run(root, "small-ddp-2", [3.0, 2.5, 2.25], [1.0, 190.0, 210.0])
    _run(root, "small-fsdp-2", [3.0, 2.5, 2.0], [50.0, 50.0, 50.0])
    _run(root, "small-fsdp-2-resume1", [3.0, 2.5, 2.125], [50.0, 50.0, 50.0])
    _run(root, "_saved-small-fsdp-2", [3.0], [1.0])  # the checkpoint source: not a row
    (root / "notes").mkdir()  # no metrics: ignored

    runs = collect(root, skip=1)
    assert [r["name"] for r in runs] == ["small-ddp-1", "small-ddp-2", "small-fsdp-2", "small-fsdp-2-resume1"]
    assert runs[0]["tokens_per_s"] == 100.0 and runs[1]["tokens_per_s"] == 200.0  # median after skip
    assert runs[0]["params_m"] == 1.23 and runs[3]["resumed_on"] == 1

    table = report(root, tmp_path / "out", command="test", skip=1)
    rows = {line.split(" | ")[3] + line.split(" | ")[4]: line for line in table.splitlines()
            if line.startswith("| small | ")}
    assert rows["ddp2"].endswith("| 200 | 2.00 | 0.2500 |")
    assert rows["ddp1"].endswith("| 100 | 1.00 | 0.0000 |")
    assert rows["fsdp2"].endswith("| 50 |  |  |")  # no 1-GPU FSDP run to compare with
    assert "| small-fsdp on 2 | 1 | 0.1250 |" in table
    readme = (tmp_path / "out" / "README.md").read_text()
    assert "- Command: `test`" in readme and table in readme
    assert [r["name"] for r in json.loads((tmp_path / "out" / "runs.json").read_text())][0] == "small-ddp-1"


def test_main_and_an_empty_root(tmp_path, capsys):
    _run(tmp_path / "runs", "tiny-ddp-1", [2.0, 1.0], [10.0, 20.0])
    assert main([str(tmp_path / "runs"), "--out", str(tmp_path / "out"), "--skip", "0"]) == 0
    assert "| tiny | 1.23 | 32 | ddp | 1 | 15 |" in capsys.readouterr().out
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no run directories"):
        report(tmp_path / "empty", tmp_path / "out2", command="test")
