"""Token cache under faults: corrupted token files, ids past the vocabulary, a build killed half-way,
a manifest deleted by hand."""

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tokenizers")

from tapa.data import Corpus, DataConfig, build_corpus  # noqa: E402
from tapa.data.cache import MANIFEST, corpus_directory  # noqa: E402

SRC = Path(__file__).resolve().parents[2] / "src"


def small_config(tmp_path) -> DataConfig:
    source = tmp_path / "corpus.txt"
    if not source.exists():
        source.write_text("".join(f"def f_{i}(x):\n    return x * {i % 9} + {i % 5}\n\n" for i in range(400)))
    return DataConfig(source=str(source), cache_dir=str(tmp_path / "cache"), vocab_size=300,
                      val_fraction=0.1, test_fraction=0.1)


def test_same_size_corruption_is_refused_with_what_to_delete(tmp_path):
    corpus = build_corpus(small_config(tmp_path), progress=False)
    path = corpus.directory / "test.bin"
    ids = np.fromfile(path, dtype=corpus.dtype)
    ids[: len(ids) // 2] = ids[: len(ids) // 2][::-1]  # same size, same value range, other order
    ids.tofile(path)
    with pytest.raises(ValueError, match=f"sha256.*delete {corpus.directory}"):
        Corpus(corpus.directory).tokens("test")
    assert len(Corpus(corpus.directory).tokens("train")) > 0  # the intact splits still load


def test_token_ids_past_the_vocabulary_are_a_clear_error(tmp_path):
    corpus = build_corpus(small_config(tmp_path), progress=False)
    manifest_path = corpus.directory / MANIFEST
    manifest = json.loads(manifest_path.read_text())
    manifest["tokenizer"]["vocab_size"] = 100  # a manifest that disagrees with its tokens
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="holds token id 2[0-9][0-9], but the tokenizer has 100 ids"):
        Corpus(corpus.directory).tokens("train")
    assert Corpus(corpus.directory).tokens("train", verify=False).max() >= 100


def test_a_killed_build_leaves_nothing_behind_after_the_next_build(tmp_path):
    cfg = small_config(tmp_path)
    killed_build = (
        "import os, signal, sys\n"
        "import tapa.data.cache as cache\n"
        "from tapa.data import DataConfig\n"
        "real = cache._build_into\n"
        "def build_then_die(staging, *args):\n"
        "    real(staging, *args)\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        "cache._build_into = build_then_die\n"
        f"cache.build_corpus(DataConfig(**{cfg.to_dict()!r}), progress=False)\n")
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    process = subprocess.Popen([sys.executable, "-c", killed_build], env=env, stderr=subprocess.PIPE)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == -signal.SIGKILL, stderr.decode()[-2000:]
    cache_dir = Path(cfg.cache_dir)
    [left] = list(cache_dir.iterdir())  # the dead build's staging directory
    assert ".tmp-" in left.name and (left / MANIFEST).is_file()
    # staging dirs of a dead build of an earlier version (no host), and of a live build, which stays
    (cache_dir / f".other-0123.tmp-{process.pid}-abcdef12").mkdir()
    live = cache_dir / f".other-0123.tmp-{socket.gethostname()}-{os.getpid()}-abcdef12"
    live.mkdir()

    corpus = build_corpus(cfg, progress=False)
    assert corpus.built
    assert sorted(p.name for p in cache_dir.iterdir()) == sorted([corpus.directory.name, live.name])


def test_a_deleted_manifest_is_rebuilt(tmp_path, capsys):
    cfg = small_config(tmp_path)
    first = build_corpus(cfg, progress=False)
    expected = np.array(first.tokens("train"))
    (first.directory / MANIFEST).unlink()
    second = build_corpus(cfg, progress=False)
    assert second.built and second.directory == corpus_directory(cfg)
    assert np.array_equal(np.array(second.tokens("train")), expected)
    assert "no manifest.json" in capsys.readouterr().err
    assert [p.name for p in Path(cfg.cache_dir).iterdir()] == [second.directory.name]
