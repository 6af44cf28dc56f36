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
    hybrid = "TAPA hybrid (LLLG, w256)"
    assert [(r["pe"], r["seq_len"]) for r in rows] == [("TAPA", "32"), (hybrid, "32"), ("RoPE", "32"),
                                                       ("TAPA", "64"), (hybrid, "64"), ("RoPE", "64")]
    for row in rows:
        assert float(row["tokens_per_s"]) > 0 and float(row["step_ms"]) > 0
        expected = float(row["tokens_per_s"]) / float(next(
            r["tokens_per_s"] for r in rows if r["pe"] == "RoPE" and r["seq_len"] == row["seq_len"]))
        assert float(row["tapa_over_rope"]) == pytest.approx(expected, rel=1e-2, abs=5e-4)  # 3 decimals
    readme = (out / "README.md").read_text()
    assert "--warmup 1 --steps 1 --pes tapa tapa:LLLG:256 rope --cpu-smoke --out" in readme
    assert "| TAPA | tapa-reference |" in readme and f"| {hybrid} | local+tapa-reference |" in readme
    assert "TAPA/RoPE" in capsys.readouterr().out
    assert (out / "throughput.png").is_file() and "throughput.png" in readme


def test_selective_checkpointing_rows_and_their_command(tmp_path, capsys):
    """--checkpointing off,2,on times no checkpointing, the first 2 of the 4 blocks, and all; the
    README's command reproduces the settings (with --doc-mask)."""
    out = tmp_path / "bench"
    assert main(["bench", "model", "--cpu-smoke", "--warmup", "0", "--steps", "1", "--lengths", "32",
                 "--pes", "rope", "--checkpointing", "off,2,on", "--doc-mask", "8", "--out", str(out)]) == 0
    rows = list(csv.DictReader(open(out / "results.csv")))
    assert [r["checkpointing"] for r in rows] == ["False", "2", "True"]
    assert "--checkpointing off,2,on --doc-mask 8 --cpu-smoke" in (out / "README.md").read_text()
    assert " ckpt=2 " in capsys.readouterr().out
    for bad, message in (("5", "the model has 4 blocks"), ("off,x", "'x' is not off, on or a positive")):
        with pytest.raises(SystemExit) as error:
            main(["bench", "model", "--cpu-smoke", "--checkpointing", bad, "--out", str(out)])
        assert message in str(error.value) or error.value.code == 2


def test_a_checkpointed_block_count_gives_the_same_loss_and_gradients():
    """TapaLM.checkpoint_blocks = n recomputes the first n blocks (counted) and changes no number."""
    import torch.utils.checkpoint as ckpt

    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=40, dim=32, n_layers=4, n_heads=2, layer_pattern="LLLG",
                      local_window=4)
    ids = torch.randint(0, 40, (2, 17))
    grads = {}
    calls = []
    original = ckpt.checkpoint
    for setting in (False, 2, True):
        torch.manual_seed(1)  # the same weights each time
        model = TapaLM(cfg).double()
        model.checkpoint_blocks = setting
        calls.clear()
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr("tapa.model.decoder.checkpoint",
                          lambda fn, *a, **k: calls.append(type(fn).__name__) or original(fn, *a, **k))
            model(ids[:, :-1], targets=ids[:, 1:]).backward()
        grads[setting] = [p.grad for p in model.parameters()]
        assert calls.count("Block") == {False: 0, 2: 2, True: 4}[setting]  # and the loss's chunks
    for setting in (2, True):
        for got, want in zip(grads[setting], grads[False]):
            assert torch.allclose(got, want, rtol=0, atol=1e-12)


def test_a_cut_run_keeps_the_configs_it_measured(tmp_path, monkeypatch):
    """Results are written after every config: a run stopped by a time limit (here: the fourth
    config raises) leaves the first three on disk, marked partial, with the ratio where RoPE ran."""
    import tapa.bench.model as bench

    real, calls = bench.measure, []

    def measure(cfg, **kwargs):
        calls.append(cfg.label)
        if len(calls) == 4:
            raise KeyboardInterrupt("cut")
        return real(cfg, **kwargs)

    monkeypatch.setattr(bench, "measure", measure)
    out = tmp_path / "bench"
    assert main(["bench", "model", "--cpu-smoke", "--warmup", "1", "--steps", "1",
                 "--lengths", "32", "64", "--out", str(out)]) == 130  # the CLI's code for an interrupt
    rows = list(csv.DictReader(open(out / "results.csv")))
    assert [(r["pe"], r["seq_len"]) for r in rows] == [("TAPA", "32"), ("TAPA hybrid (LLLG, w256)", "32"),
                                                       ("RoPE", "32")]
    assert all(r["tapa_over_rope"] for r in rows)
    assert "PARTIAL: 3 of 6 configs so far" in (out / "README.md").read_text()


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


def test_flop_count_of_a_hybrid_counts_local_layers_at_their_window():
    cfg = ModelConfig(dim=64, n_layers=4, n_heads=2, vocab_size=100, layer_pattern="LLLG", local_window=32)
    with torch.device("meta"):
        model = TapaLM(cfg)
    assert flops_per_token(model, 128) == 6 * matmul_params(model) + 6 * (3 * 32 + 128) * 64
    assert flops_per_token(model, 16) == 6 * matmul_params(model) + 6 * 4 * 16 * 64


def test_flop_count_with_packed_documents_counts_the_attention_the_mask_keeps():
    from tapa.model import Documents
    cfg = ModelConfig(dim=64, n_layers=4, n_heads=2, vocab_size=100, layer_pattern="LLLG", local_window=32)
    with torch.device("meta"):
        model = TapaLM(cfg)
    one_row = torch.zeros(2, 128, dtype=torch.long)  # one document a row: the dense count
    assert flops_per_token(model, 128, Documents.from_ids(one_row)) == flops_per_token(model, 128)
    # rows of 64 + 64 and 96 + 16 + 16 tokens (labels restart in each row): span = sum n^2 / 256
    ids = torch.tensor([[0] * 64 + [1] * 64, [0] * 96 + [1] * 16 + [2] * 16])
    span = (64**2 + 64**2 + 96**2 + 16**2 + 16**2) / 256
    assert span == 70.0
    assert flops_per_token(model, 128, Documents.from_ids(ids)) == 6 * matmul_params(model) + 6 * (3 * 32 + span) * 64
    short = torch.tensor([[0, 0, 1, 1, 2, 2, 3, 3]])  # documents shorter than the window
    assert flops_per_token(model, 8, Documents.from_ids(short)) == 6 * matmul_params(model) + 6 * 4 * 2.0 * 64


def test_doc_mask_packs_rows_the_same_way_every_time():
    from tapa.bench.model import document_ids

    ids = document_ids(3, 500, 40, "cpu")
    assert ids.shape == (3, 500) and torch.equal(ids, document_ids(3, 500, 40, "cpu"))
    assert bool((ids[:, 1:] >= ids[:, :-1]).all()) and bool((ids[:, 0] == 0).all())
    counts = [len(row.unique()) for row in ids]
    assert all(5 < n < 40 for n in counts)  # about 500 / 40 documents a row


def test_attention_path_names_the_document_masked_path():
    from tapa.bench.model import attention_path
    cpu = torch.device("cpu")
    rope = ModelConfig(dim=64, n_layers=4, n_heads=2, vocab_size=100, pe="rope")
    hybrid = ModelConfig(dim=64, n_layers=4, n_heads=2, vocab_size=100, pe="nope", layer_pattern="LLLG",
                         local_window=32)
    assert attention_path(rope, cpu) == "sdpa"
    assert attention_path(rope, cpu, documents=True) == "chunked-documents"
    assert attention_path(hybrid, cpu, documents=True) == "local+chunked-documents"
    tapa = ModelConfig(dim=64, n_layers=4, n_heads=2, vocab_size=100, pe="tapa")
    assert attention_path(tapa, cpu, documents=True) == "tapa-reference"
