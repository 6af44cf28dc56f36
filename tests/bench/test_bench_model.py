"""`tapa bench model`: its whole code path on CPU (--cpu-smoke), and a loud error without CUDA."""

import csv

import pytest
import torch

from tapa.bench.model import flops_per_token, matmul_params
from tapa.cli import main
from tapa.model import ModelConfig, TapaLM


def test_cpu_smoke_writes_results(tmp_path, capsys):
    out = tmp_path / "bench"
    assert main(["bench", "model", "--cpu-smoke", "--warmup", "1", "--steps", "1",
                 "--lengths", "32", "64", "--out", str(out)]) == 0
    rows = list(csv.DictReader(open(out / "results.csv")))
    assert [(r["pe"], r["seq_len"]) for r in rows] == [("tapa", "32"), ("rope", "32"),
                                                       ("tapa", "64"), ("rope", "64")]
    for row in rows:
        assert float(row["tokens_per_s"]) > 0 and float(row["step_ms"]) > 0
        expected = float(row["tokens_per_s"]) / float(next(
            r["tokens_per_s"] for r in rows if r["pe"] == "rope" and r["seq_len"] == row["seq_len"]))
        assert float(row["tapa_over_rope"]) == pytest.approx(expected, rel=1e-2)
    readme = (out / "README.md").read_text()
    assert "--warmup 1 --steps 1 --pes tapa rope --cpu-smoke --out" in readme and "| tapa | tapa-reference |" in readme
    assert "TAPA/RoPE" in capsys.readouterr().out
    assert (out / "throughput.png").is_file() and "throughput.png" in readme


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA error")
def test_needs_cuda_without_smoke_flag(tmp_path):
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        main(["bench", "model", "--out", str(tmp_path)])
    assert not any(tmp_path.iterdir())


def test_flop_count():
    cfg = ModelConfig(dim=64, n_layers=2, n_heads=2, vocab_size=100)
    with torch.device("meta"):
        model = TapaLM(cfg)
    per_layer = 4 * 64 * 64 + 3 * 64 * cfg.ffn_dim + 2 * 64  # attention, SwiGLU, two norms
    assert matmul_params(model) == 2 * per_layer + 64 + 100 * 64  # + final norm + tied lm_head
    assert flops_per_token(model, 128) == 6 * matmul_params(model) + 6 * 2 * 128 * 64
