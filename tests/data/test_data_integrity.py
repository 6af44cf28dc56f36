"""Issue 34, the token cache: its tokenizer files are checked like its token arrays (case 4), and
`tapa data build` checks a cache before it says it reused it (case 5)."""

import json

import numpy as np
import pytest

from tapa.cli import main
from tapa.data import DataConfig, build_corpus


def _config(tmp_path) -> DataConfig:
    return DataConfig(source="builtin", cache_dir=str(tmp_path / "cache"), vocab_size=300, max_train_bytes=100_000)


def _build_flags(tmp_path):
    return ["data", "build", "--cache-dir", str(tmp_path / "cache"), "--vocab-size", "300",
            "--max-train-bytes", "100000", "--quiet"]


def _swap_two_ids(path):
    tokenizer = json.loads(path.read_text())
    vocab = tokenizer["model"]["vocab"]
    a, b = sorted(vocab)[40], sorted(vocab)[41]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    path.write_text(json.dumps(tokenizer))


def test_data_build_checks_the_cache_before_it_says_reused(tmp_path, capsys):
    assert main(_build_flags(tmp_path)) == 0
    assert main(_build_flags(tmp_path)) == 0
    assert "reused the cache" in capsys.readouterr().out
    corpus = build_corpus(_config(tmp_path), progress=False)
    path = corpus.directory / "train.bin"
    ids = np.fromfile(path, dtype=corpus.dtype)
    ids[:64] = np.roll(ids[:64], 1)  # same size, same ids, another order
    ids.tofile(path)
    with pytest.raises(SystemExit, match=rf"train.bin does not match the sha256 .*delete {corpus.directory}"):
        main(_build_flags(tmp_path))
    assert "reused" not in capsys.readouterr().out


def test_the_tokenizer_files_are_checked_like_the_tokens(tmp_path):
    corpus = build_corpus(_config(tmp_path), progress=False)
    assert set(corpus.manifest["tokenizer"]["files"]) >= {"tokenizer.json"}
    _swap_two_ids(corpus.tokenizer_dir / "tokenizer.json")
    again = build_corpus(_config(tmp_path), progress=False)
    with pytest.raises(ValueError, match=rf"tokenizer.json is missing or does not match .*delete {again.directory}"):
        again.encode("def f(): pass")
    with pytest.raises(SystemExit, match="tokenizer.json is missing or does not match"):
        main(_build_flags(tmp_path))
