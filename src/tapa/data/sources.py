"""Text sources: each lists its documents under stable keys, in a fixed order, and reads them.

A document's split is a function of its key alone (see `split_of`), so adding or removing a file
never moves another file between train, val and test, and no file straddles two splits.

Sources:
- builtin: the .py files under this interpreter's stdlib directory (sysconfig "stdlib"), keyed by
  path relative to it, sorted. Test packages (Lib/test, idlelib/idle_test, ...) are kept: they are
  real code and more than half the bytes. site-packages/dist-packages are skipped unless
  include_site_packages, in which case the site directories are added under "site-packages/".
  The stdlib ships a few files that are deliberately not UTF-8 (encoding tests); they are
  skipped, and those met while reading are listed in the manifest. Empty files (many __init__.py) are skipped.
- a directory: every regular file below it (recursively, sorted by relative path, hidden names
  and __pycache__ skipped) is one document. A file that is not UTF-8 text is an error.
- a .jsonl file: one document per non-blank line, from the string field `text_field`.
- any other file: one text, cut at line boundaries into contiguous train/val/test parts
  (first 1 - val - test of the bytes, then val, then test), since one file has no files to hash.
- "hf:<name>" or "hf:<directory>": a Hugging Face `datasets` dataset (optional extra). A directory
  is opened with load_from_disk, anything else with load_dataset (online; "hf:name:config" picks a
  config). Its own train/validation/test splits are used when it has them; otherwise rows are split
  by the hash of their index.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import site
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from tapa._optional import require
from tapa.data.config import SPLITS, DataConfig


@dataclass(frozen=True)
class Document:
    key: str
    text: str


def split_score(key: str) -> float:
    """A uniform number in [0, 1) fixed by the key (sha256; Python's hash() is salted per run)."""
    digest = hashlib.sha256(key.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def split_of(key: str, val_fraction: float, test_fraction: float) -> str:
    score = split_score(key)
    if score < test_fraction:
        return "test"
    if score < test_fraction + val_fraction:
        return "val"
    return "train"


def assign_splits(keys: list[str], val_fraction: float, test_fraction: float, *, what: str) -> dict[str, str]:
    """Split of each key by `split_of`. A small source whose val or test split comes out empty
    (while its fraction is > 0) gets the train document(s) with the lowest scores moved there, so
    every requested split has text; with fewer than 3 documents that is impossible: an error."""
    splits = {key: split_of(key, val_fraction, test_fraction) for key in keys}
    for split, fraction in (("test", test_fraction), ("val", val_fraction)):
        if fraction <= 0 or split in splits.values():
            continue
        train_keys = sorted((split_score(k), k) for k, s in splits.items() if s == "train")
        if len(train_keys) < 2:
            raise ValueError(
                f"{what} has {len(keys)} document(s); a train/val/test split needs at least 3 "
                "(add files, pass a single text file to split it by lines, or set "
                "val_fraction=test_fraction=0)"
            )
        splits[train_keys[0][1]] = split
    return splits


def read_text(path: Path) -> str:
    """The UTF-8 text of a file, or a ValueError naming the path."""
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise ValueError(f"cannot read {path}: {err.strerror or err}") from err
    if b"\x00" in raw:
        raise ValueError(f"{path} is not a text file (it contains NUL bytes)")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{path} is not UTF-8 text ({err.reason} at byte {err.start})") from err


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-.")[:48] or "source"


class Source:
    """Base: keys() in order, the split of each key, read(keys) -> documents in order."""

    kind: str
    slug: str
    path: Path | None = None

    def keys(self) -> list[str]:
        raise NotImplementedError

    def splits(self, val_fraction: float, test_fraction: float) -> dict[str, str]:
        return assign_splits(self.keys(), val_fraction, test_fraction, what=self.describe()["source"])

    def read(self, wanted: set[str]) -> Iterator[Document]:
        raise NotImplementedError

    def total_bytes(self, keys: set[str] | None = None) -> int:
        """Bytes to read for `keys` (all when None); an estimate where only the total is known."""
        total = self.size_on_disk()
        return total if keys is None else total * len(keys) // max(1, len(self.keys()))

    def size_on_disk(self) -> int:
        raise NotImplementedError

    def fingerprint(self) -> str:
        raise NotImplementedError

    def describe(self) -> dict:
        raise NotImplementedError


class FileTreeSource(Source):
    """Files as documents, keyed by relative path. `files` maps key -> path."""

    def __init__(self, files: dict[str, Path], *, skip_undecodable: bool):
        self.files = dict(sorted(files.items()))
        self.sizes = {}
        self.mtimes = {}
        for key, path in self.files.items():
            try:
                stat = path.stat()
            except OSError as err:
                raise ValueError(f"cannot read {path}: {err.strerror or err}") from err
            self.sizes[key] = stat.st_size
            self.mtimes[key] = stat.st_mtime_ns
        self.skip_undecodable = skip_undecodable
        self.skipped: dict[str, str] = {}  # key -> why, filled while reading

    def keys(self) -> list[str]:
        return [key for key in self.files if self.sizes[key] > 0]

    def read(self, wanted: set[str]) -> Iterator[Document]:
        for key in self.keys():
            if key not in wanted:
                continue
            try:
                text = read_text(self.files[key])
            except ValueError as err:
                if not self.skip_undecodable:
                    raise
                self.skipped[key] = str(err).replace(str(self.files[key]), "file")
                continue
            yield Document(key, text)

    def total_bytes(self, keys: set[str] | None = None) -> int:
        return sum(size for key, size in self.sizes.items() if keys is None or key in keys)

    def fingerprint(self) -> str:
        listing = "".join(f"{k}\0{self.sizes[k]}\0{self.mtimes[k]}\n" for k in self.files)
        return hashlib.sha256(listing.encode("utf-8")).hexdigest()

    def _counts(self) -> dict:
        return {
            "files": len(self.files),
            "empty_files": len(self.files) - len(self.keys()),
            "skipped_files": dict(sorted(self.skipped.items())),
        }


def _walk(root: Path, *, suffix: str | None, skip_dirs: set[str]) -> dict[str, Path]:
    files = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not d.startswith(".") and d not in skip_dirs]
        for name in filenames:
            if name.startswith(".") or (suffix is not None and not name.endswith(suffix)):
                continue
            path = Path(dirpath) / name
            if path.is_file():
                files[path.relative_to(root).as_posix()] = path
    return files


class BuiltinPythonSource(FileTreeSource):
    kind = "builtin"

    def __init__(self, include_site_packages: bool = False):
        self.root = Path(sysconfig.get_paths()["stdlib"])
        if not self.root.is_dir():
            raise ValueError(f"the stdlib directory {self.root} (sysconfig 'stdlib') does not exist")
        site_names = {"site-packages", "dist-packages", "__pycache__"}
        files = _walk(self.root, suffix=".py", skip_dirs=site_names)
        self.site_dirs: list[str] = []
        if include_site_packages:
            candidates = [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
            candidates += site.getsitepackages() if hasattr(site, "getsitepackages") else []
            for site_dir in dict.fromkeys(str(Path(c).resolve()) for c in candidates):
                if Path(site_dir).is_dir():
                    self.site_dirs.append(site_dir)
                    for key, path in _walk(Path(site_dir), suffix=".py", skip_dirs={"__pycache__"}).items():
                        files.setdefault(f"site-packages/{key}", path)
        if not files:
            raise ValueError(f"no .py files found under the stdlib directory {self.root}")
        super().__init__(files, skip_undecodable=True)
        self.include_site_packages = include_site_packages
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
        self.python_version = f"{version}.{sys.version_info.micro}"
        self.slug = f"builtin-py{version}" + ("-site" if include_site_packages else "")

    def describe(self) -> dict:
        return {
            "source": "builtin",
            "kind": self.kind,
            "path": str(self.root),
            "python_version": self.python_version,
            "include_site_packages": self.include_site_packages,
            "site_dirs": self.site_dirs,
            **self._counts(),
        }


class DirectorySource(FileTreeSource):
    kind = "directory"

    def __init__(self, path: Path):
        self.path = path
        files = _walk(path, suffix=None, skip_dirs={"__pycache__"})
        if not files:
            raise ValueError(f"source directory {path} contains no files")
        super().__init__(files, skip_undecodable=False)
        if not self.keys():
            raise ValueError(f"source directory {path}: all {len(files)} files are empty")
        self.slug = _slug(path.name)

    def describe(self) -> dict:
        return {"source": str(self.path), "kind": self.kind, "path": str(self.path), **self._counts()}


def _stat_fingerprint(path: Path) -> str:
    stat = path.stat()
    return hashlib.sha256(f"{path.name}\0{stat.st_size}\0{stat.st_mtime_ns}".encode()).hexdigest()


class JsonlSource(Source):
    kind = "jsonl"

    def __init__(self, path: Path, text_field: str):
        self.path = path
        self.text_field = text_field
        self.slug = _slug(path.stem)
        self.size = path.stat().st_size
        # Validate every line up front, so a bad line fails before minutes of tokenizer training.
        self._keys = [str(lineno) for lineno, _ in self._rows()]
        if not self._keys:
            raise ValueError(f"{path} has no non-empty '{text_field}' texts")

    def _rows(self) -> Iterator[tuple[int, str]]:
        try:
            handle = open(self.path, encoding="utf-8")
        except OSError as err:
            raise ValueError(f"cannot read {self.path}: {err.strerror or err}") from err
        with handle:
            try:
                for lineno, line in enumerate(handle, start=1):
                    if not line.strip():
                        continue
                    try:
                        row = json.loads(line)
                    except json.JSONDecodeError as err:
                        raise ValueError(f"{self.path}:{lineno}: invalid JSON ({err.msg})") from err
                    if not isinstance(row, dict) or self.text_field not in row:
                        fields = sorted(row) if isinstance(row, dict) else type(row).__name__
                        raise ValueError(
                            f"{self.path}:{lineno}: no field '{self.text_field}' (found {fields}); "
                            "set text_field to the field that holds the text"
                        )
                    text = row[self.text_field]
                    if not isinstance(text, str):
                        raise ValueError(
                            f"{self.path}:{lineno}: field '{self.text_field}' is "
                            f"{type(text).__name__}, not a string"
                        )
                    if text:
                        yield lineno, text
            except UnicodeDecodeError as err:
                raise ValueError(f"{self.path} is not UTF-8 text ({err.reason})") from err

    def keys(self) -> list[str]:
        return self._keys

    def read(self, wanted: set[str]) -> Iterator[Document]:
        for lineno, text in self._rows():
            if str(lineno) in wanted:
                yield Document(str(lineno), text)

    def size_on_disk(self) -> int:
        return self.size

    def fingerprint(self) -> str:
        return _stat_fingerprint(self.path)

    def describe(self) -> dict:
        return {
            "source": str(self.path),
            "kind": self.kind,
            "path": str(self.path),
            "text_field": self.text_field,
            "lines": len(self._keys),
        }


class TextFileSource(Source):
    """One text file, cut into contiguous train / val / test parts at line boundaries."""

    kind = "file"

    def __init__(self, path: Path, val_fraction: float, test_fraction: float):
        self.path = path
        self.slug = _slug(path.name)
        self.size = path.stat().st_size
        if self.size == 0:
            raise ValueError(f"source file {path} is empty")
        self.fractions = (val_fraction, test_fraction)

    def keys(self) -> list[str]:
        return list(SPLITS)

    def splits(self, val_fraction: float, test_fraction: float) -> dict[str, str]:
        if (val_fraction, test_fraction) != self.fractions:
            raise ValueError(f"{self.path} was opened for fractions {self.fractions}")
        return {split: split for split in SPLITS}

    def read(self, wanted: set[str]) -> Iterator[Document]:
        val_fraction, test_fraction = self.fractions
        lines = read_text(self.path).splitlines(keepends=True)
        needed = 1 + (val_fraction > 0) + (test_fraction > 0)
        if len(lines) < needed:
            raise ValueError(f"source file {self.path} has {len(lines)} line(s); splitting it needs {needed}")
        sizes = [len(line.encode("utf-8")) for line in lines]
        total = sum(sizes)
        bounds = [(1 - val_fraction - test_fraction) * total, (1 - test_fraction) * total]
        cuts, running, index = [], 0, 0
        for bound in bounds:
            while index < len(lines) and running + sizes[index] <= bound:
                running += sizes[index]
                index += 1
            cuts.append(index)
        # every requested split gets at least one line
        has_val, has_test = int(val_fraction > 0), int(test_fraction > 0)
        train_end = min(max(cuts[0], 1), len(lines) - has_val - has_test)
        val_end = min(max(cuts[1], train_end + has_val), len(lines) - has_test)
        cuts = [train_end, val_end]
        parts = {"train": lines[: cuts[0]], "val": lines[cuts[0] : cuts[1]], "test": lines[cuts[1] :]}
        for split in SPLITS:
            if split in wanted and parts[split]:
                yield Document(split, "".join(parts[split]))

    def size_on_disk(self) -> int:
        return self.size

    def fingerprint(self) -> str:
        return _stat_fingerprint(self.path)

    def describe(self) -> dict:
        return {"source": str(self.path), "kind": self.kind, "path": str(self.path), "bytes": self.size}


class HFDatasetSource(Source):
    """A `datasets` Dataset or DatasetDict; rows are documents, the text is row[text_field]."""

    kind = "hf"

    def __init__(self, spec: str, text_field: str):
        datasets = require("datasets")
        self.spec = spec
        self.text_field = text_field
        local = Path(spec).expanduser()
        looks_like_path = spec.startswith((".", "/", "~")) or local.exists()
        if looks_like_path:
            if not local.is_dir():
                raise ValueError(f"hf source directory {local} does not exist")
            self.path = local = local.resolve()
            self.spec = spec = str(local)
            try:
                loaded = datasets.load_from_disk(str(local))
            except Exception as err:  # datasets raises several types; name the path either way
                raise ValueError(f"cannot load a datasets directory from {local}: {err}") from err
        else:
            name, _, config = spec.partition(":")
            try:
                loaded = datasets.load_dataset(name, config or None)
            except Exception as err:  # offline, unknown name, bad config: all end here
                raise ValueError(
                    f"cannot load hf dataset {name!r}{f' (config {config!r})' if config else ''} "
                    f"with datasets.load_dataset: {err}"
                ) from err
        if isinstance(loaded, datasets.DatasetDict):
            self.parts = dict(loaded)
        else:
            self.parts = {"train": loaded}
        for part_name, part in self.parts.items():
            if text_field not in part.column_names:
                raise ValueError(
                    f"hf dataset {spec} ({part_name}) has no column '{text_field}' "
                    f"(columns: {part.column_names}); set text_field"
                )
        # the dataset's own splits when it has them, else the hash split of row keys
        named = {"train": "train", "validation": "val", "valid": "val", "val": "val", "test": "test"}
        self.own_splits = "train" in self.parts and any(named.get(p) in ("val", "test") for p in self.parts)
        self.part_split = {p: named[p] for p in self.parts if named.get(p)} if self.own_splits else {}
        self.slug = "hf-" + _slug(spec)
        self._keys = [f"{p}:{i}" for p in self.parts for i in range(len(self.parts[p]))]
        if not self._keys:
            raise ValueError(f"hf dataset {spec} has no rows")

    def keys(self) -> list[str]:
        return self._keys

    def splits(self, val_fraction: float, test_fraction: float) -> dict[str, str]:
        if self.own_splits:  # rows of parts with other names (e.g. "unsupervised") are left out
            parts = {key: key.split(":")[0] for key in self._keys}
            return {key: self.part_split[part] for key, part in parts.items() if part in self.part_split}
        return super().splits(val_fraction, test_fraction)

    def read(self, wanted: set[str]) -> Iterator[Document]:
        for part_name, part in self.parts.items():
            for index, text in enumerate(_column(part, self.text_field)):
                key = f"{part_name}:{index}"
                if key in wanted and isinstance(text, str) and text:
                    yield Document(key, text)

    def size_on_disk(self) -> int:
        return sum(part.data.nbytes for part in self.parts.values())

    def fingerprint(self) -> str:
        prints = [f"{n}:{getattr(p, '_fingerprint', len(p))}" for n, p in self.parts.items()]
        if self.path is not None:
            listing = sorted(
                f"{f.relative_to(self.path)}:{f.stat().st_size}:{f.stat().st_mtime_ns}"
                for f in self.path.rglob("*") if f.is_file()
            )
            prints += listing
        return hashlib.sha256("\n".join(prints).encode("utf-8")).hexdigest()

    def describe(self) -> dict:
        return {
            "source": f"hf:{self.spec}",
            "kind": self.kind,
            "path": str(self.path) if self.path else None,
            "text_field": self.text_field,
            "parts": {n: len(p) for n, p in self.parts.items()},
            "own_splits": self.own_splits,
        }


def _column(part, field: str) -> Iterator:
    """Stream one column in chunks (a whole column of a large dataset would not fit in memory)."""
    chunk = 1024
    for start in range(0, len(part), chunk):
        yield from part[start : start + chunk][field]


def open_source(cfg: DataConfig) -> Source:
    """The Source that `cfg.source` names; a missing, empty or unreadable one is a ValueError."""
    spec = cfg.source
    if spec == "builtin":
        return BuiltinPythonSource(cfg.include_site_packages)
    if spec.startswith("hf:"):
        return HFDatasetSource(spec[3:], cfg.text_field)
    path = Path(spec).expanduser()
    if not path.exists():
        raise ValueError(f"source path {path} does not exist (source={spec!r})")
    path = path.resolve()  # one cache entry however the path is spelled
    if path.is_dir():
        return DirectorySource(path)
    if not os.access(path, os.R_OK):
        raise ValueError(f"cannot read source file {path} (permission denied)")
    if path.suffix == ".jsonl":
        return JsonlSource(path, cfg.text_field)
    return TextFileSource(path, cfg.val_fraction, cfg.test_fraction)
