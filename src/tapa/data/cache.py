"""The token cache: a source tokenized once into flat token files, reused until the source or the
tokenizer changes.

Layout of one cache entry, <cache_dir>/<source slug>-<key>/:
    manifest.json       source, fingerprint, tokenizer hash, per-split docs/bytes/tokens, ...
    tokenizer/tokenizer.json
    train.bin, val.bin, test.bin   token ids, uint16 (vocab <= 65536) or uint32, native order;
                                   every document is followed by the end-of-text id
The key hashes everything the tokens depend on: the source's fingerprint (its file list with sizes
and mtimes, or the dataset fingerprint), the split fractions, max_train_bytes and the tokenizer
(its config when trained here, the sha256 of its tokenizer.json when given). Any change there is
a new key, hence a rebuild; the same config finds its directory and reuses it. A given tokenizer
whose tokenizer.json (the same sha256) and end-of-text token are those of an existing entry with the
same source and settings, such as a copy of the BPE a run trained here, reuses that entry (it holds
the tokens a build would write) instead of tokenizing again. An entry is built in a temporary
directory and renamed into place, so a reader never sees half a cache, and two processes building
the same entry at once both end up with one complete copy. A build that was killed leaves its
temporary directory behind; the next build removes it. An entry without its manifest (deleted by
hand) is rebuilt.

The first time a process reads a split, its file is checked against the manifest's sha256 and its
largest id against the vocabulary (about a second per 100M tokens), and the tokenizer's files
against theirs when it is loaded, so a corrupted cache is an error naming what to delete, never a
silently wrong run. `Corpus.verify` checks it all at once (`tapa data build` before "reused").
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import shutil
import socket
import sys
import time
import uuid
import warnings
from pathlib import Path
from typing import Iterator

import numpy as np

from tapa._optional import require
from tapa._paths import file_sha256
from tapa.data.config import SPLITS, DataConfig
from tapa.data.sources import Document, Source, open_source
from tapa.data.tokenizer import (
    end_of_text_token,
    load_tokenizer,
    save_tokenizer,
    tokenizer_file,
    train_bpe,
)

FORMAT_VERSION = 2  # bump when the layout or the manifest changes: old entries are not reused
MANIFEST = "manifest.json"
LONG_DOC_THRESHOLDS = (1024, 4096, 16384, 65536)  # document lengths (tokens) the manifest counts
ENCODE_BATCH_BYTES = 1 << 21  # text per encode_batch call: enough to keep all cores busy
STAGING_MARK = ".tmp-"  # .<entry>.tmp-<host>-<pid>-<random>: an entry being built
REMOVING_MARK = ".removing-"  # .<entry>.removing-<random>: an entry being deleted
STAGING_MAX_AGE_S = 7 * 24 * 3600  # a staging dir of another host is removed after this long
_VERIFIED_FILES: set[tuple] = set()  # (path, size, mtime_ns) of token files checked in this process


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


class Corpus:
    """A built cache entry: token arrays per split, the tokenizer, and the manifest."""

    def __init__(self, directory: str | Path, *, built: bool = False):
        self.directory = Path(directory)
        path = self.directory / MANIFEST
        try:
            self.manifest = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as err:
            raise ValueError(f"{path} is missing or unreadable; delete {self.directory} and rebuild") from err
        self.built = built  # True when this call tokenized it, False when it came from the cache
        self.tokenizer_dir = self.directory / "tokenizer"
        self.vocab_size: int = self.manifest["tokenizer"]["vocab_size"]
        self.eot_id: int = self.manifest["tokenizer"]["eot_id"]
        self.dtype = np.dtype(self.manifest["dtype"])
        self._tokenizer = None
        for split in SPLITS:
            expected = self.manifest["splits"][split]["tokens"] * self.dtype.itemsize
            path = self.directory / f"{split}.bin"
            actual = path.stat().st_size if path.is_file() else None
            if actual != expected:
                raise ValueError(
                    f"{path} has {actual if actual is not None else 'no'} bytes, the manifest says "
                    f"{expected}; the cache is corrupt, delete {self.directory} and rebuild"
                )

    def tokens(self, split: str, *, verify: bool = True) -> np.ndarray:
        """All token ids of a split as a read-only memmap (documents separated by eot_id).
        verify: check the file (sha256, ids < vocab) the first time this process reads it."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        if self.manifest["splits"][split]["tokens"] == 0:
            return np.empty(0, dtype=self.dtype)  # np.memmap refuses empty files
        path = self.directory / f"{split}.bin"
        ids = np.memmap(path, dtype=self.dtype, mode="r")
        if verify:
            self._verify(split, path, ids)
        return ids

    def _verify(self, split: str, path: Path, ids: np.ndarray) -> None:
        stat = path.stat()
        key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
        if key in _VERIFIED_FILES:
            return
        remedy = f"the token cache is corrupt: delete {self.directory} and run again to rebuild it"
        expected = self.manifest["splits"][split].get("sha256")
        if expected is not None and file_sha256(path) != expected:
            raise ValueError(f"{path} does not match the sha256 in its {MANIFEST}; {remedy}")
        largest = int(ids.max())
        if largest >= self.vocab_size:
            raise ValueError(f"{path} holds token id {largest}, but the tokenizer has {self.vocab_size} "
                             f"ids; {remedy}")
        _VERIFIED_FILES.add(key)

    def verify(self) -> None:
        """Check every split and the tokenizer against the manifest; ValueError naming what to delete."""
        for split in SPLITS:
            self.tokens(split)
        self.verify_tokenizer()

    def verify_tokenizer(self) -> None:
        """The tokenizer files against the sha256 in the manifest (every file of the tokenizer/
        folder since it lists them; tokenizer.json for older caches)."""
        meta = self.manifest["tokenizer"]
        expected = meta.get("files") or ({"tokenizer.json": meta["sha256"]} if meta.get("sha256") else {})
        for name, digest in expected.items():
            path = self.tokenizer_dir / name
            if not path.is_file() or file_sha256(path) != digest:
                raise ValueError(f"{path} is missing or does not match the sha256 in its {MANIFEST}; the token "
                                 f"cache is corrupt: delete {self.directory} and run again to rebuild it")

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            self.verify_tokenizer()
            self._tokenizer = load_tokenizer(self.tokenizer_dir)
        return self._tokenizer

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text).ids

    def decode(self, ids) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)

    def __repr__(self) -> str:
        counts = ", ".join(f"{s}={self.manifest['splits'][s]['tokens']:,}" for s in SPLITS)
        return f"Corpus({self.directory}, vocab={self.vocab_size}, tokens: {counts})"


def cache_key(cfg: DataConfig, source: Source) -> dict:
    """Everything the cached tokens depend on (hashed into the directory name)."""
    if cfg.tokenizer is not None:
        tokenizer = {"kind": "file", "sha256": file_sha256(tokenizer_file(cfg.tokenizer))}
    else:
        tokenizer = {
            "kind": "bpe",
            "vocab_size": cfg.vocab_size,
            "train_bytes": cfg.tokenizer_train_bytes,
        }
    return {
        "format": FORMAT_VERSION,
        "source": source.describe()["source"],
        "source_kind": source.kind,
        "fingerprint": source.fingerprint(),
        "text_field": cfg.text_field if source.kind in ("jsonl", "hf") else None,
        "val_fraction": cfg.val_fraction,
        "test_fraction": cfg.test_fraction,
        "max_train_bytes": cfg.max_train_bytes,
        "tokenizer": tokenizer,
    }


KEY_CHARS = 16  # hex digits of the key's sha256 in an entry's name, <slug>-<key>


def corpus_directory(cfg: DataConfig, source: Source | None = None, key: dict | None = None) -> Path:
    """The entry of `cfg` (key: its `cache_key`, when the caller has it already)."""
    source = source or open_source(cfg)
    digest = hashlib.sha256(json.dumps(key or cache_key(cfg, source), sort_keys=True).encode()).hexdigest()
    return Path(cfg.cache_dir).expanduser() / f"{source.slug}-{digest[:KEY_CHARS]}"


def _same_tokens_entry(cfg: DataConfig, source: Source, key: dict) -> Path | None:
    """An existing entry of `source` in the cache directory that holds the tokens a build of `cfg`
    would write, though its key differs: cfg.tokenizer is given and the entry's key equals this
    config's in all but the tokenizer, its tokenizer.json has the same sha256 as the given one and
    its end-of-text token is the one the given directory gives (a copy of the BPE a run trained
    here, say); key: cfg's `cache_key`. None when cfg trains its own BPE or no entry qualifies;
    entries being built or removed, and those without a readable manifest, are skipped."""
    if cfg.tokenizer is None:
        return None
    cache_dir = Path(cfg.cache_dir).expanduser()
    if not cache_dir.is_dir():
        return None
    key = json.loads(json.dumps(key))  # as a manifest stores it (tuples -> lists)
    wanted = {name: value for name, value in key.items() if name != "tokenizer"}
    eot_token = None  # of the given tokenizer, read at the first entry that needs it
    for directory in sorted(cache_dir.glob(f"{source.slug}-*")):
        if directory.name.startswith(".") or len(directory.name) != len(source.slug) + 1 + KEY_CHARS:
            continue
        try:
            manifest = json.loads((directory / MANIFEST).read_text(encoding="utf-8"))
            entry_key, tokenizer = dict(manifest["key"]), dict(manifest["tokenizer"])
        except (OSError, ValueError, KeyError, TypeError):  # no manifest (being rebuilt), unreadable
            continue
        if ({name: value for name, value in entry_key.items() if name != "tokenizer"} != wanted
                or tokenizer.get("sha256") != key["tokenizer"]["sha256"]):
            continue
        if eot_token is None:
            given = tokenizer_file(cfg.tokenizer).parent
            eot_token = end_of_text_token(load_tokenizer(given), given)
        if tokenizer.get("eot_token") == eot_token:
            return directory
    return None


def _cached(cfg: DataConfig) -> tuple:
    """(source, key, the entry's directory, the cached Corpus or None, whether that Corpus is
    another key's entry with the same tokens: `_same_tokens_entry`)."""
    source = open_source(cfg)
    key = cache_key(cfg, source)
    directory = corpus_directory(cfg, source, key)
    if (directory / MANIFEST).is_file():
        return source, key, directory, Corpus(directory), False
    reusable = _same_tokens_entry(cfg, source, key)
    return source, key, directory, (Corpus(reusable) if reusable is not None else None), reusable is not None


def find_corpus(cfg: DataConfig) -> Corpus | None:
    """The cached corpus for `cfg` if it was built (or an entry with the same tokens, see
    `_same_tokens_entry`), without building it."""
    return _cached(cfg)[3]


def build_corpus(cfg: DataConfig, progress: bool = True) -> Corpus:
    """Tokenize `cfg.source` into the cache (or reuse the cached copy, or an entry with the same
    tokens: `_same_tokens_entry`) and return the Corpus."""
    source, key, directory, corpus, reused = _cached(cfg)
    if corpus is not None:
        if reused and progress:
            print(f"reusing the token cache {corpus.directory}: same source and settings, and its "
                  f"tokenizer.json has the sha256 of {tokenizer_file(cfg.tokenizer)} and the same "
                  "end-of-text token, so it holds the tokens a build would write", file=sys.stderr)
        return corpus
    directory.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_staging(directory.parent)
    if directory.exists():  # renames only ever create complete entries: this one was damaged
        print(f"{directory} has no {MANIFEST} (an incomplete cache entry): rebuilding it", file=sys.stderr)
        _remove_entry(directory)
    staging = directory.parent / (f".{directory.name}{STAGING_MARK}{socket.gethostname()}-{os.getpid()}-"
                                  f"{uuid.uuid4().hex[:8]}")
    try:
        _build_into(staging, cfg, source, progress, key)
        try:
            os.rename(staging, directory)
        except OSError:
            if not (directory / MANIFEST).is_file():  # not a concurrent build that won the race
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return Corpus(directory, built=True)


def _remove_entry(directory: Path) -> None:
    """Delete a cache entry: renamed aside first, so no reader ever sees it half deleted."""
    doomed = directory.parent / f".{directory.name}{REMOVING_MARK}{uuid.uuid4().hex[:8]}"
    try:
        os.rename(directory, doomed)
    except FileNotFoundError:  # another process got there first
        return
    shutil.rmtree(doomed, ignore_errors=True)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def remove_stale_staging(cache_dir: Path) -> list[Path]:
    """Delete what dead builds left in cache_dir: staging directories whose process is gone (or,
    built on another host, older than STAGING_MAX_AGE_S) and half-removed entries; return them."""
    host = socket.gethostname()
    stale = list(cache_dir.glob(f".*{REMOVING_MARK}*"))
    for path in cache_dir.glob(f".*{STAGING_MARK}*"):
        # [host, pid, random]; builds of earlier versions wrote [pid, random]
        parts = path.name.partition(STAGING_MARK)[2].rsplit("-", 2)
        if len(parts) < 2 or not parts[-2].isdigit():
            continue
        same_host = len(parts) == 2 or parts[0] == host
        try:
            old = time.time() - path.stat().st_mtime > STAGING_MAX_AGE_S
        except FileNotFoundError:
            continue
        if old or (same_host and not _process_alive(int(parts[-2]))):
            stale.append(path)
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)
    return stale


def _split_documents(source: Source, assignment: dict[str, str], split: str, byte_limit: int | None = None
                     ) -> Iterator[Document]:
    """The documents of one split in source order, stopping after `byte_limit` UTF-8 bytes (the
    last document cut at a character boundary); files past the limit are never read."""
    budget = byte_limit
    for doc in source.read({key for key, part in assignment.items() if part == split}):
        if budget is None:
            yield doc
            continue
        text, used = _cut_utf8(doc.text, budget)
        budget = budget - used if text == doc.text else 0
        if text:
            yield Document(doc.key, text)
        if budget <= 0:
            return


def _cut_utf8(text: str, limit: int) -> tuple[str, int]:
    """The longest prefix of `text` within `limit` UTF-8 bytes, and its size in bytes."""
    encoded = text.encode("utf-8")
    if len(encoded) <= limit:
        return text, len(encoded)
    kept = encoded[:limit].decode("utf-8", errors="ignore")
    return kept, len(kept.encode("utf-8"))


def _tqdm(progress: bool, **kwargs):
    """A tqdm bar when progress is asked for and stderr is a terminal (None: tqdm's own check)."""
    return require("tqdm").tqdm(disable=None if progress else True, **kwargs)


def _build_into(staging: Path, cfg: DataConfig, source: Source, progress: bool, key: dict) -> None:
    started = time.perf_counter()
    staging.mkdir(parents=True)
    assignment = source.splits(cfg.val_fraction, cfg.test_fraction)
    tokenizer_dir = staging / "tokenizer"

    if cfg.tokenizer is not None:
        given = tokenizer_file(cfg.tokenizer)
        tokenizer_dir.mkdir()
        for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            if (given.parent / name).is_file():
                shutil.copy2(given.parent / name, tokenizer_dir / name)
        tokenizer = load_tokenizer(tokenizer_dir)
        tokenizer_info = {"kind": "file", "from": str(given), "trained_on_bytes": None}
    else:
        # the tokenizer's bytes are a prefix of the (possibly capped) train split
        limits = [n for n in (cfg.max_train_bytes, cfg.tokenizer_train_bytes) if n is not None]
        train_docs = _split_documents(source, assignment, "train", min(limits, default=None))
        counter = _ByteCounter(doc.text for doc in train_docs)
        if progress:
            print(f"training a byte-level BPE (vocab {cfg.vocab_size}) on the train split", file=sys.stderr)
        # the tokenizers library draws its bars whatever stderr is: only on a terminal
        tokenizer = train_bpe(counter, cfg.vocab_size, progress=progress and sys.stderr.isatty())
        if counter.bytes == 0:
            raise ValueError(f"source {cfg.source}: the train split has no text")
        if tokenizer.get_vocab_size() < cfg.vocab_size:
            warnings.warn(
                f"the train split of {cfg.source} yields only {tokenizer.get_vocab_size()} BPE tokens, "
                f"fewer than vocab_size={cfg.vocab_size}; the corpus uses the smaller vocabulary"
            )
        save_tokenizer(tokenizer, tokenizer_dir)
        tokenizer_info = {"kind": "bpe", "from": None, "trained_on_bytes": counter.bytes}
    tokenizer_seconds = time.perf_counter() - started
    eot_token = end_of_text_token(tokenizer, tokenizer_dir)
    eot_id = tokenizer.token_to_id(eot_token)
    vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    dtype = token_dtype(vocab_size)

    counts = {split: {"docs": 0, "bytes": 0, "tokens": 0, "longest_doc_tokens": 0,
                      "tokens_in_docs_of_at_least": {str(n): 0 for n in LONG_DOC_THRESHOLDS}}
              for split in SPLITS}
    digests = {split: hashlib.sha256() for split in SPLITS}
    files = {split: open(staging / f"{split}.bin", "wb") for split in SPLITS}
    train_keys = {key for key, split in assignment.items() if split == "train"}
    train_bytes = source.total_bytes(train_keys)
    if cfg.max_train_bytes is not None:
        train_bytes = min(train_bytes, cfg.max_train_bytes)
    total = train_bytes + source.total_bytes(set(assignment) - train_keys)
    bar = _tqdm(progress, total=total, unit="B", unit_scale=True, desc="tokenizing")
    try:
        batch: list[tuple[str, Document]] = []
        batch_bytes = 0
        # the same ids without the character offsets, where tokenizers has it (0.20+)
        encode = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)
        clock = {"encode": 0.0, "flush": 0.0}

        def flush() -> None:
            entered = time.perf_counter()
            encodings = encode([doc.text for _, doc in batch])
            clock["encode"] += time.perf_counter() - entered
            for (split, doc), encoding in zip(batch, encodings):
                ids = np.asarray(encoding.ids + [eot_id], dtype=dtype)
                files[split].write(ids.tobytes())
                digests[split].update(ids.tobytes())
                count = counts[split]
                count["docs"] += 1
                count["bytes"] += len(doc.text.encode("utf-8"))
                count["tokens"] += len(ids)
                # how much of the split can feed long contexts without crossing a document end
                count["longest_doc_tokens"] = max(count["longest_doc_tokens"], len(ids))
                for threshold in LONG_DOC_THRESHOLDS:
                    if len(ids) >= threshold:
                        count["tokens_in_docs_of_at_least"][str(threshold)] += len(ids)
            bar.update(sum(len(doc.text) for _, doc in batch))
            bar.set_postfix(tokens=f"{sum(c['tokens'] for c in counts.values()):,}")
            batch.clear()
            clock["flush"] += time.perf_counter() - entered

        for split in SPLITS:
            limit = cfg.max_train_bytes if split == "train" else None
            for doc in _split_documents(source, assignment, split, limit):
                batch.append((split, doc))
                batch_bytes += len(doc.text)
                if batch_bytes >= ENCODE_BATCH_BYTES:
                    flush()
                    batch_bytes = 0
        if batch:
            flush()
    finally:
        bar.close()
        for handle in files.values():
            handle.close()
    for split in SPLITS:
        counts[split]["sha256"] = digests[split].hexdigest()
    if counts["train"]["tokens"] == 0:
        raise ValueError(f"source {cfg.source}: the train split has no text")

    manifest = {
        "format": FORMAT_VERSION,
        "key": key,
        "source": source.describe(),
        "fingerprint": source.fingerprint(),
        "config": cfg.to_dict(),
        "tokenizer": {
            **tokenizer_info,
            "vocab_size": vocab_size,
            "sha256": file_sha256(tokenizer_dir / "tokenizer.json"),
            "files": {path.name: file_sha256(path) for path in sorted(tokenizer_dir.iterdir()) if path.is_file()},
            "eot_token": eot_token,
            "eot_id": eot_id,
        },
        "dtype": dtype.name,
        "byteorder": sys.byteorder,
        "splits": counts,
        "python_version": sys.version.split()[0],
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "build_seconds": round(time.perf_counter() - started, 2),
        "tokenizer_seconds": round(tokenizer_seconds, 2),  # training (or copying) the tokenizer
        # of the rest: the tokenizer's batch encoding, and writing its ids (the remainder: reading)
        "encode_seconds": round(clock["encode"], 2),
        "write_seconds": round(clock["flush"] - clock["encode"], 2),
    }
    (staging / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")


class _ByteCounter:
    """Passes texts through and counts their UTF-8 bytes (what the tokenizer was trained on)."""

    def __init__(self, texts):
        self.texts = texts
        self.bytes = 0

    def __iter__(self):
        for text in self.texts:
            self.bytes += len(text.encode("utf-8"))
            yield text
