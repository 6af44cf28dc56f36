"""The retrofit path of issue 38, end to end on a tiny random Llama on the CPU: convert to an LLLG
hybrid, continue (train --init-from the converted directory), evaluate the result, export it."""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM  # noqa: E402

from tapa.cli import main as tapa_main  # noqa: E402
from tapa.data.tokenizer import save_tokenizer, train_bpe  # noqa: E402

VOCAB = 300
TRAIN_FLAGS = ["--seq-len", "32", "--batch-size", "2", "--steps", "2", "--warmup-steps", "1",
               "--eval-every", "2", "--eval-batches", "1", "--save-every", "2", "--log-every", "1",
               "--device", "cpu", "--no-progress", "--no-plot"]


def stdlib_text(n_files: int = 12) -> list[str]:
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:n_files]
    return [path.read_text(errors="replace") for path in files]


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    """A tiny random Llama with a tokenizer.json, and a text directory to continue on."""
    root = tmp_path_factory.mktemp("retrofit")
    texts = stdlib_text()
    text_dir = root / "text"
    text_dir.mkdir()
    for i, text in enumerate(texts):
        (text_dir / f"doc{i}.txt").write_text(text)
    path = root / "llama"
    tokenizer = train_bpe(texts, VOCAB, progress=False)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=tokenizer.get_vocab_size(), hidden_size=64, intermediate_size=96,
                         num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=32, tie_word_embeddings=False,
                         eos_token_id=tokenizer.token_to_id("<|endoftext|>"))
    LlamaForCausalLM(config).save_pretrained(path)
    save_tokenizer(tokenizer, path)
    return path, text_dir


def test_train_init_from_a_converted_directory(llama_dir, tmp_path, monkeypatch):
    llama, text = llama_dir
    monkeypatch.setenv("TAPA_CACHE", str(tmp_path / "cache"))
    hybrid = tmp_path / "hybrid"
    assert tapa_main(["convert", str(llama), str(hybrid), "--layer-pattern", "LLLG", "--local-window", "16"]) == 0
    run = tmp_path / "run"
    assert tapa_main(["train", "--init-from", str(hybrid), "--data", str(text), "--run-dir", str(run),
                      *TRAIN_FLAGS]) == 0
    saved = json.loads((run / "config.json").read_text())
    assert saved["model"]["layer_pattern"] == "LLLG" and saved["data"]["tokenizer"] == str(hybrid)
    assert saved["init_from"] == str(hybrid)
    # the unconverted Llama: one line that says to convert it
    with pytest.raises(SystemExit, match=r"^tapa train: error: .*holds a 'llama' model, not a TAPA one; "
                                         r"convert it first: tapa convert"):
        tapa_main(["train", "--init-from", str(llama), "--data", str(text), *TRAIN_FLAGS])
    with pytest.raises(SystemExit, match=r"^tapa train: error: --init-from .*pass --data SOURCE"):
        tapa_main(["train", "--init-from", str(hybrid), *TRAIN_FLAGS])


EVAL_FLAGS = ["--lengths", "32,64", "--max-tokens", "256", "--stride", "32", "--device", "cpu", "--no-progress"]


def test_retrofit_path_end_to_end(llama_dir, tmp_path, monkeypatch, capsys):
    """The README's four commands: convert, train --init-from, eval, export; and eval of the
    converted and the exported directories."""
    llama, text = llama_dir
    monkeypatch.setenv("TAPA_CACHE", str(tmp_path / "cache"))
    hybrid, run, exported = tmp_path / "hybrid", tmp_path / "run", tmp_path / "exported"
    assert tapa_main(["convert", str(llama), str(hybrid), "--layer-pattern", "LLLG", "--local-window", "16",
                      "--pe", "tapa"]) == 0
    assert tapa_main(["train", "--init-from", str(hybrid), "--data", str(text), "--run-dir", str(run),
                      *TRAIN_FLAGS]) == 0
    assert tapa_main(["eval", str(run), "--data", str(text), *EVAL_FLAGS]) == 0
    assert tapa_main(["export", str(run), str(exported)]) == 0
    out = capsys.readouterr().out
    assert "TAPA hybrid (LLLG, w16)" in out
    model = AutoModelForCausalLM.from_pretrained(exported).eval()
    assert model.config.layer_pattern == "LLLG"
    # every model directory is a starting point: eval the converted and the exported one
    for directory in (hybrid, exported):
        assert tapa_main(["eval", str(directory), "--data", str(text), *EVAL_FLAGS]) == 0
        results = json.loads((directory / f"eval-{text.name}" / "results.json").read_text())
        assert [r["length"] for r in results["methods"][0]["perplexity"]] == [32, 64]
    converted = json.loads((hybrid / f"eval-{text.name}" / "results.json").read_text())
    assert converted["data"]["tokenizer"]["from_model_dir"] == str(hybrid)
    assert converted["methods"][0]["train_len"] == 32  # the Llama's max_position_embeddings
    exported_results = json.loads((exported / f"eval-{text.name}" / "results.json").read_text())
    assert exported_results["methods"][0]["train_len"] == 32  # the run's seq_len
    # mistakes: one line each
    with pytest.raises(SystemExit, match=r"^tapa eval: error: .*model directory.*pass --data SOURCE"):
        tapa_main(["eval", str(hybrid), *EVAL_FLAGS])
    with pytest.raises(SystemExit, match=r"^tapa eval: error: .*holds a 'llama' model, not a TAPA one"):
        tapa_main(["eval", str(llama), "--data", str(text), *EVAL_FLAGS])
    other = tmp_path / "other-tokenizer"
    save_tokenizer(train_bpe(stdlib_text(4), VOCAB + 40, progress=False), other)
    with pytest.raises(SystemExit, match=r"^tapa train: error: the corpus' tokenizer has \d+ tokens but the "
                                         r"checkpoint .* has vocab_size \d+[^\n]*$"):
        tapa_main(["train", "--init-from", str(hybrid), "--data", str(text), "--tokenizer", str(other),
                   "--run-dir", str(tmp_path / "run2"), *TRAIN_FLAGS])
