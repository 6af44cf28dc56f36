"""`tapa bench generate`: its logic on CPU (the smoke model; graph mode needs CUDA)."""

import csv

import pytest
import torch

from tapa.bench import generate as bench
from tapa.cli import main as tapa_main


@pytest.mark.skipif(torch.cuda.is_available(), reason="the smoke run is the CPU path")
def test_smoke_writes_every_model_mode_and_shape(tmp_path):
    assert tapa_main(["bench", "generate", "--smoke", "--new-tokens", "6", "--pes", "tapa", "rope:LG:8",
                      "--out", str(tmp_path)]) == 0
    rows = list(csv.DictReader(open(tmp_path / "generate.csv")))
    assert {(r["model"], r["batch"], r["prompt"], r["mode"]) for r in rows} == {
        (m, b, p, mode) for m in ("tapa", "rope:LG:8") for b in ("1", "2") for p in ("12", "20")
        for mode in ("eager", "static")}
    assert all(r["agree_steps"] == "6" for r in rows)  # float32 on CPU: the same greedy tokens
    assert all(float(r["ms_per_token"]) > 0 for r in rows)
    report = (tmp_path / "generate.md").read_text()
    assert "SMOKE RUN" in report and "| x tapa |" in report  # the first model is the anchor
    assert all(float(r["x_first"]) == 1.0 for r in rows if r["model"] == "tapa")
    hybrid = [r for r in rows if r["model"] == "rope:LG:8"]
    anchor = {(r["batch"], r["prompt"], r["mode"]): float(r["ms_per_token"]) for r in rows if r["model"] == "tapa"}
    assert all(abs(float(r["x_first"]) - float(r["ms_per_token"]) / anchor[(r["batch"], r["prompt"], r["mode"])])
               < 1e-9 for r in hybrid)
    assert "**static mode, ms per token over tapa's**" in report and "rope:LG:8 1 / 12:" in report


def test_rope_is_the_default_anchor_and_timed_first():
    import argparse

    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    assert parser.parse_args([]).pes[0] == "rope"


def test_agree_steps_counts_leading_equal_columns():
    reference = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]])
    assert bench.agree_steps(reference.clone(), reference) == 4
    changed = reference.clone()
    changed[1, 2] = 0
    assert bench.agree_steps(changed, reference) == 2
    changed[0, 0] = 9
    assert bench.agree_steps(changed, reference) == 0


def test_bad_arguments(tmp_path):
    with pytest.raises(SystemExit, match="at least 3"):
        tapa_main(["bench", "generate", "--smoke", "--new-tokens", "2", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="PE:LAYER_PATTERN:LOCAL_WINDOW"):
        tapa_main(["bench", "generate", "--smoke", "--pes", "tapa:LLLG", "--out", str(tmp_path)])
