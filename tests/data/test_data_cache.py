"""Token cache: layout, reuse, rebuild on change, determinism, and the `tapa data` command."""

import os
import time

import numpy as np
import pytest

pytest.importorskip("tokenizers")

from tapa.cli import main as tapa_main  # noqa: E402
from tapa.data import SPLITS, DataConfig, build_corpus, find_corpus  # noqa: E402
from tapa.data.cache import token_dtype  # noqa: E402
from tapa.data.tokenizer import EOT_TOKEN, save_tokenizer, train_bpe  # noqa: E402

SMALL_VOCAB = 300


def make_text_dir(root, n_files=12):
    root.mkdir(parents=True, exist_ok=True)
    for i in range(n_files):
        body = "".join(f"def function_{i}_{j}(x):\n    return x * {j} + {i}\n\n" for j in range(20))
        (root / f"module_{i:02d}.py").write_text(f'"""Module {i}: café ∑."""\n' + body, encoding="utf-8")
    return root


def small_config(tmp_path, source, **overrides):
    values = dict(source=str(source), cache_dir=str(tmp_path / "cache"), vocab_size=SMALL_VOCAB,
                  val_fraction=0.15, test_fraction=0.15)
    return DataConfig(**{**values, **overrides})


def split_documents(corpus, split):
    """Decode a split back into its documents (each ends with the end-of-text id)."""
    ids = np.asarray(corpus.tokens(split))
    assert ids.size == 0 or ids[-1] == corpus.eot_id
    ends = np.flatnonzero(ids == corpus.eot_id)
    starts = np.concatenate([[0], ends[:-1] + 1])
    return [corpus.decode(ids[s:e]) for s, e in zip(starts, ends)]


def test_build_layout_and_contents(tmp_path):
    source = make_text_dir(tmp_path / "src")
    corpus = build_corpus(small_config(tmp_path, source), progress=False)
    assert corpus.built and corpus.vocab_size == SMALL_VOCAB
    assert corpus.eot_id == corpus.tokenizer.token_to_id(EOT_TOKEN)
    assert corpus.dtype == np.uint16 and corpus.tokens("train").dtype == np.uint16
    manifest = corpus.manifest
    files = {p.name: p.read_text(encoding="utf-8") for p in source.iterdir()}
    seen = []
    for split in SPLITS:
        docs = split_documents(corpus, split)
        counts = manifest["splits"][split]
        assert counts["docs"] == len(docs) > 0
        assert counts["tokens"] == len(corpus.tokens(split))
        assert counts["bytes"] == sum(len(d.encode("utf-8")) for d in docs)
        doc_tokens = np.diff(np.concatenate([[-1], np.flatnonzero(corpus.tokens(split) == corpus.eot_id)]))
        assert counts["longest_doc_tokens"] == doc_tokens.max()  # lengths count the end-of-text token
        assert counts["tokens_in_docs_of_at_least"]["1024"] == doc_tokens[doc_tokens >= 1024].sum()
        seen += docs
    # every file is one document in exactly one split, in full
    assert sorted(seen) == sorted(files.values())
    assert corpus.decode(corpus.encode("x = 1  # ∑\n")) == "x = 1  # ∑\n"
    assert (corpus.tokenizer_dir / "tokenizer.json").is_file()
    assert manifest["source"]["kind"] == "directory" and manifest["tokenizer"]["kind"] == "bpe"
    assert not [p for p in (tmp_path / "cache").iterdir() if ".tmp-" in p.name]  # staging removed
    assert token_dtype(65536) == np.uint16 and token_dtype(65537) == np.uint32


def test_rerun_reuses_the_cache(tmp_path):
    cfg = small_config(tmp_path, make_text_dir(tmp_path / "src"))
    first = build_corpus(cfg, progress=False)
    stamps = {p.name: p.stat().st_mtime_ns for p in first.directory.iterdir()}
    second = build_corpus(cfg, progress=False)
    assert not second.built and second.directory == first.directory
    assert {p.name: p.stat().st_mtime_ns for p in second.directory.iterdir()} == stamps
    assert find_corpus(cfg).directory == first.directory


def test_changed_source_or_tokenizer_rebuilds(tmp_path):
    source = make_text_dir(tmp_path / "src")
    cfg = small_config(tmp_path, source)
    original = build_corpus(cfg, progress=False)

    changed = source / "module_03.py"
    changed.write_text(changed.read_text() + "extra = 1\n")
    os.utime(changed, ns=(time.time_ns(), time.time_ns() + 10**9))  # mtime moves even on coarse clocks
    edited = build_corpus(cfg, progress=False)
    assert edited.built and edited.directory != original.directory

    bigger_vocab = build_corpus(small_config(tmp_path, source, vocab_size=SMALL_VOCAB + 20), progress=False)
    assert bigger_vocab.built and bigger_vocab.vocab_size == SMALL_VOCAB + 20

    # an existing tokenizer directory: its content is part of the key
    tok_dir = tmp_path / "tok"
    words = [f"word{i} {i * 7} {i % 13}\n" for i in range(300)]
    save_tokenizer(train_bpe(iter(words), 280, progress=False), tok_dir)
    given = build_corpus(small_config(tmp_path, source, tokenizer=str(tok_dir)), progress=False)
    assert given.built and given.manifest["tokenizer"]["kind"] == "file" and given.vocab_size == 280
    assert not build_corpus(small_config(tmp_path, source, tokenizer=str(tok_dir)), progress=False).built
    save_tokenizer(train_bpe(iter(f"other{i} text {i * 3}\n" for i in range(300)), 280, progress=False), tok_dir)
    retrained = build_corpus(small_config(tmp_path, source, tokenizer=str(tok_dir)), progress=False)
    assert retrained.built and retrained.directory != given.directory


def test_jsonl_and_max_train_bytes(tmp_path):
    path = tmp_path / "docs.jsonl"
    rows = [f'{{"text": "document {i}: {"word " * (i + 5)}"}}' for i in range(40)]
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    full = build_corpus(small_config(tmp_path, path), progress=False)
    # 300 bytes cannot fill 300 BPE entries: a warning, and the corpus keeps the real size
    with pytest.warns(UserWarning, match="fewer than vocab_size=300"):
        capped = build_corpus(small_config(tmp_path, path, max_train_bytes=300), progress=False)
    assert capped.vocab_size == capped.tokenizer.get_vocab_size() < 300
    assert capped.directory != full.directory
    assert capped.manifest["splits"]["train"]["bytes"] == 300 < full.manifest["splits"]["train"]["bytes"]
    for split in ("val", "test"):  # only train is capped
        assert np.array_equal(capped.tokens(split), full.tokens(split)) or (
            capped.manifest["tokenizer"]["sha256"] != full.manifest["tokenizer"]["sha256"]
        )
        assert capped.manifest["splits"][split]["bytes"] == full.manifest["splits"][split]["bytes"]
    assert full.manifest["tokenizer"]["trained_on_bytes"] == full.manifest["splits"]["train"]["bytes"]
    with pytest.warns(UserWarning, match="fewer than vocab_size"):
        subset = build_corpus(small_config(tmp_path, path, tokenizer_train_bytes=500), progress=False)
    assert subset.manifest["tokenizer"]["trained_on_bytes"] == 500
    for name in ("docs", "bytes"):  # the whole train split, tokenized by a tokenizer that saw less
        assert subset.manifest["splits"]["train"][name] == full.manifest["splits"]["train"][name]


def test_builtin_build_is_deterministic(tmp_path):
    kwargs = dict(vocab_size=400, max_train_bytes=60_000, val_fraction=0.004, test_fraction=0.004)
    first = build_corpus(DataConfig(cache_dir=str(tmp_path / "a"), **kwargs), progress=False)
    second = build_corpus(DataConfig(cache_dir=str(tmp_path / "b"), **kwargs), progress=False)
    assert first.built and second.built
    assert first.manifest["splits"] == second.manifest["splits"]
    assert first.manifest["tokenizer"]["sha256"] == second.manifest["tokenizer"]["sha256"]
    assert first.manifest["splits"]["train"]["bytes"] == 60_000
    assert all(first.manifest["splits"][s]["tokens"] > 0 for s in SPLITS)
    source = first.manifest["source"]
    assert source["kind"] == "builtin" and source["files"] > 500


def test_truncated_cache_file_is_a_clear_error(tmp_path):
    corpus = build_corpus(small_config(tmp_path, make_text_dir(tmp_path / "src")), progress=False)
    path = corpus.directory / "train.bin"
    path.write_bytes(path.read_bytes()[:-2])
    with pytest.raises(ValueError, match="cache is corrupt"):
        build_corpus(small_config(tmp_path, tmp_path / "src"), progress=False)


def test_cli_build_and_info(tmp_path, capsys):
    source = make_text_dir(tmp_path / "src")
    args = ["--data", str(source), "--cache-dir", str(tmp_path / "cache"), "--vocab-size", str(SMALL_VOCAB),
            "--val-fraction", "0.15", "--test-fraction", "0.15", "--quiet"]
    assert tapa_main(["data", "info", *args]) == 1
    out, err = capsys.readouterr()
    assert not out and err.startswith("tapa data: error: no cached corpus for this configuration")
    # listing an empty cache is an empty listing, not a failure
    assert tapa_main(["data", "info", "--all", "--cache-dir", str(tmp_path / "empty")]) == 0
    assert capsys.readouterr().out.startswith("no cached corpora under")
    assert tapa_main(["data", "build", *args]) == 0
    out = capsys.readouterr().out
    assert "| train |" in out and "| total | 12 |" in out and "built in" in out
    # --no-progress, the name train and eval use, is --quiet's other name
    assert tapa_main(["data", "build", *[a for a in args if a != "--quiet"], "--no-progress"]) == 0
    assert "reused the cache" in capsys.readouterr().out
    assert tapa_main(["data", "info", *args]) == 0
    info = capsys.readouterr().out
    assert f"vocab {SMALL_VOCAB}" in info and " s encoding, " in info
    assert tapa_main(["data", "info", "--all", "--cache-dir", str(tmp_path / "cache")]) == 0
    assert "src-" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="^tapa data: error: source path .* does not exist"):
        tapa_main(["data", "build", "--source", str(tmp_path / "nope"), "--cache-dir", str(tmp_path)])


def test_progress_bars_stay_off_a_non_terminal(tmp_path, capfd):
    """Without --quiet, a build whose stderr is not a terminal (a log file, CI) draws no bars: one
    line says the tokenizer is being trained, and nothing else."""
    source = make_text_dir(tmp_path / "src")
    assert tapa_main(["data", "build", "--data", str(source), "--cache-dir", str(tmp_path / "cache"),
                      "--vocab-size", str(SMALL_VOCAB), "--val-fraction", "0.15",
                      "--test-fraction", "0.15"]) == 0
    err = capfd.readouterr().err  # the file descriptor: tokenizers' bars bypass sys.stderr
    assert err.splitlines() == [f"training a byte-level BPE (vocab {SMALL_VOCAB}) on the train split"], err


def test_concurrent_builds_of_one_entry_end_with_one_copy(tmp_path, monkeypatch):
    """Two processes building the same entry: the one that renames second keeps the first copy."""
    import tapa.data.cache as cache

    cfg = small_config(tmp_path, make_text_dir(tmp_path / "src"))
    real_build_into = cache._build_into

    def build_while_another_process_wins(staging, *args):
        real_build_into(staging, *args)
        rival = staging.parent / "rival-staging"
        real_build_into(rival, *args)
        os.rename(rival, cache.corpus_directory(cfg))

    monkeypatch.setattr(cache, "_build_into", build_while_another_process_wins)
    corpus = build_corpus(cfg, progress=False)
    assert corpus.tokens("train").size > 0
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [corpus.directory.name]  # no staging left


def test_fast_batch_encoding_writes_the_same_tokens(tmp_path, monkeypatch):
    """The build encodes with encode_batch_fast where tokenizers has it (no character offsets):
    the split digests equal those of a build through plain encode_batch, and the manifest says
    where the time went."""
    from tokenizers import Tokenizer

    if not hasattr(Tokenizer, "encode_batch_fast"):
        pytest.skip("this tokenizers has no encode_batch_fast")
    source = make_text_dir(tmp_path / "src", n_files=30)
    fast = build_corpus(small_config(tmp_path, source, cache_dir=str(tmp_path / "fast")), progress=False)
    calls = []
    real = Tokenizer.encode_batch
    monkeypatch.delattr(Tokenizer, "encode_batch_fast")
    monkeypatch.setattr(Tokenizer, "encode_batch", lambda self, *a, **kw: calls.append(1) or real(self, *a, **kw))
    plain = build_corpus(small_config(tmp_path, source, cache_dir=str(tmp_path / "plain")), progress=False)
    assert calls, "the second build did not go through encode_batch"
    assert fast.manifest["splits"] == plain.manifest["splits"]
    assert 0 <= fast.manifest["encode_seconds"] <= fast.manifest["build_seconds"]
    assert fast.manifest["write_seconds"] >= 0
