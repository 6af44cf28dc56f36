"""Token cache: a given tokenizer that is the BPE an entry trained (a run's tokenizer copied into a
model directory by `tapa convert`) reuses that entry instead of tokenizing the source again."""

import json
import shutil

import pytest

pytest.importorskip("tokenizers")

import tapa.data.cache as cache  # noqa: E402
from helpers import python_like_text  # noqa: E402
from tapa.data import DataConfig, build_corpus, find_corpus  # noqa: E402
from tapa.data.tokenizer import save_tokenizer, train_bpe  # noqa: E402


def small_config(tmp_path, **overrides) -> DataConfig:
    source = tmp_path / "corpus.txt"
    if not source.exists():
        source.write_text(python_like_text(400))
    values = dict(source=str(source), cache_dir=str(tmp_path / "cache"), vocab_size=300,
                  val_fraction=0.1, test_fraction=0.1)
    return DataConfig(**{**values, **overrides})


def trained_entry(tmp_path):
    """The entry of a BPE trained here, and a copy of its tokenizer folder outside the cache."""
    corpus = build_corpus(small_config(tmp_path), progress=False)
    model_dir = tmp_path / "model"
    shutil.copytree(corpus.tokenizer_dir, model_dir)
    return corpus, model_dir


def forbid_builds(monkeypatch):
    def fail(*args):
        raise AssertionError("the corpus was tokenized again")

    monkeypatch.setattr(cache, "_build_into", fail)


def test_the_trained_tokenizer_given_as_a_file_reuses_its_entry(tmp_path, monkeypatch, capsys):
    first, model_dir = trained_entry(tmp_path)
    forbid_builds(monkeypatch)
    cfg = small_config(tmp_path, tokenizer=str(model_dir))
    assert cache.corpus_directory(cfg) != first.directory  # another key: reuse, not a plain cache hit
    corpus = build_corpus(cfg, progress=True)
    assert corpus.directory == first.directory and not corpus.built
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and f"reusing the token cache {first.directory}" in err, err
    assert build_corpus(cfg, progress=False).directory == first.directory
    assert capsys.readouterr().err == ""
    assert find_corpus(cfg).directory == first.directory
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [first.directory.name]


def test_another_tokenizer_json_builds_a_new_entry(tmp_path):
    first, model_dir = trained_entry(tmp_path)
    save_tokenizer(train_bpe(iter([python_like_text(400)]), 290, progress=False), model_dir)
    cfg = small_config(tmp_path, tokenizer=str(model_dir))
    assert find_corpus(cfg) is None
    corpus = build_corpus(cfg, progress=False)
    assert corpus.built and corpus.directory != first.directory and corpus.vocab_size == 290


@pytest.mark.parametrize("change", [{"max_train_bytes": 5000}, {"val_fraction": 0.2}])
def test_other_settings_build_a_new_entry(tmp_path, change):
    first, model_dir = trained_entry(tmp_path)
    cfg = small_config(tmp_path, tokenizer=str(model_dir), **change)
    assert find_corpus(cfg) is None
    corpus = build_corpus(cfg, progress=False)
    assert corpus.built and corpus.directory != first.directory
    assert corpus.manifest["tokenizer"]["sha256"] == first.manifest["tokenizer"]["sha256"]


def test_another_end_of_text_token_builds_a_new_entry(tmp_path):
    first, model_dir = trained_entry(tmp_path)
    path = first.directory / cache.MANIFEST
    manifest = json.loads(path.read_text())
    manifest["tokenizer"]["eot_token"] = "<|other|>"
    path.write_text(json.dumps(manifest))
    corpus = build_corpus(small_config(tmp_path, tokenizer=str(model_dir)), progress=False)
    assert corpus.built and corpus.directory != first.directory


def test_entries_being_built_or_without_a_readable_manifest_are_skipped(tmp_path):
    first, model_dir = trained_entry(tmp_path)
    cache_dir = tmp_path / "cache"
    for name in (f".{first.directory.name}.tmp-host-1-abcd", f".{first.directory.name}.removing-abcd"):
        shutil.copytree(first.directory, cache_dir / name)
    (first.directory / cache.MANIFEST).write_text("{not json")
    assert find_corpus(small_config(tmp_path, tokenizer=str(model_dir))) is None
