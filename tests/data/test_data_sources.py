"""Sources: deterministic listing, disjoint splits, and clear errors on bad input."""

import json
import sys
from pathlib import Path

import pytest

from tapa.data import DataConfig
from tapa.data.sources import (
    BuiltinPythonSource,
    DirectorySource,
    JsonlSource,
    TextFileSource,
    assign_splits,
    open_source,
    split_of,
)


def write_tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root


def read_all(source, cfg=DataConfig()):
    assignment = source.splits(cfg.val_fraction, cfg.test_fraction)
    docs = {doc.key: doc.text for doc in source.read(set(assignment))}
    return assignment, docs


def test_split_of_is_stable_and_follows_fractions():
    keys = [f"pkg/module_{i}.py" for i in range(20000)]
    first = [split_of(k, 0.1, 0.05) for k in keys]
    assert first == [split_of(k, 0.1, 0.05) for k in keys]
    share = {s: first.count(s) / len(keys) for s in ("train", "val", "test")}
    assert abs(share["val"] - 0.1) < 0.01 and abs(share["test"] - 0.05) < 0.01
    # a hash split: a new key never moves an old one
    grown = assign_splits(keys + ["new.py"], 0.1, 0.05, what="t")
    assert [grown[k] for k in keys] == first


def test_small_source_still_gets_val_and_test():
    splits = assign_splits(["a", "b", "c"], 0.01, 0.01, what="t")
    assert sorted(splits.values()) == ["test", "train", "val"]
    with pytest.raises(ValueError, match="at least 3"):
        assign_splits(["a", "b"], 0.01, 0.01, what="dir x")
    assert set(assign_splits(["a"], 0.0, 0.0, what="t").values()) == {"train"}


def test_builtin_lists_stdlib_sorted_and_disjoint():
    source = BuiltinPythonSource()
    keys = source.keys()
    assert keys == sorted(keys) and len(keys) == len(set(keys)) and len(keys) > 500
    assert "os.py" in keys and not any(k.startswith(("site-packages/", "dist-packages/")) for k in keys)
    assignment = source.splits(0.02, 0.02)
    assert assignment == BuiltinPythonSource().splits(0.02, 0.02)
    by_split = {s: {k for k, v in assignment.items() if v == s} for s in ("train", "val", "test")}
    assert all(by_split.values()) and set().union(*by_split.values()) == set(keys)
    assert sum(map(len, by_split.values())) == len(keys)  # each file in exactly one split
    assert source.describe()["python_version"].startswith(f"{sys.version_info.major}.{sys.version_info.minor}")


def test_builtin_site_packages_only_on_request(tmp_path, monkeypatch):
    stdlib = write_tree(tmp_path / "lib", {"os.py": "import sys\n", "json/__init__.py": "x = 1\n",
                                           "notes.txt": "not python", "site-packages/pkg/mod.py": "y = 2\n"})
    paths = {"stdlib": str(stdlib), "purelib": str(stdlib / "site-packages"),
             "platlib": str(stdlib / "site-packages")}
    monkeypatch.setattr("sysconfig.get_paths", lambda: paths)
    monkeypatch.setattr("site.getsitepackages", lambda: [])
    assert BuiltinPythonSource().keys() == ["json/__init__.py", "os.py"]
    with_site = BuiltinPythonSource(include_site_packages=True)
    assert with_site.keys() == ["json/__init__.py", "os.py", "site-packages/pkg/mod.py"]
    assert with_site.slug.endswith("-site") and with_site.fingerprint() != BuiltinPythonSource().fingerprint()


def test_directory_source_recursive_sorted_skips_hidden_and_empty(tmp_path):
    write_tree(tmp_path, {"b.txt": "bee\n", "a/z.md": "zed\n", "a/y.txt": "why\n", ".git/x": "hidden",
                          ".hidden.txt": "h", "empty.txt": ""})
    source = open_source(DataConfig(source=str(tmp_path)))
    assert isinstance(source, DirectorySource)
    assert source.keys() == ["a/y.txt", "a/z.md", "b.txt"]
    assignment, docs = read_all(source)
    assert docs == {"a/y.txt": "why\n", "a/z.md": "zed\n", "b.txt": "bee\n"}
    assert sorted(assignment.values()) == ["test", "train", "val"]


def test_jsonl_source_reads_the_text_field(tmp_path):
    path = tmp_path / "docs.jsonl"
    rows = [{"text": f"document {i}", "id": i} for i in range(5)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n", encoding="utf-8")
    source = open_source(DataConfig(source=str(path)))
    assert isinstance(source, JsonlSource)
    _, docs = read_all(source)
    assert sorted(docs.values()) == [f"document {i}" for i in range(5)]
    other = tmp_path / "other.jsonl"
    other.write_text("\n".join(json.dumps({"body": f"b{i}"}) for i in range(3)), encoding="utf-8")
    _, docs = read_all(open_source(DataConfig(source=str(other), text_field="body")))
    assert sorted(docs.values()) == ["b0", "b1", "b2"]


def test_text_file_is_cut_into_contiguous_parts(tmp_path):
    lines = [f"line {i}\n" for i in range(200)]
    path = tmp_path / "book.txt"
    path.write_text("".join(lines), encoding="utf-8")
    source = open_source(DataConfig(source=str(path), val_fraction=0.1, test_fraction=0.05))
    assert isinstance(source, TextFileSource)
    assignment, docs = read_all(source, DataConfig(val_fraction=0.1, test_fraction=0.05))
    assert docs["train"] + docs["val"] + docs["test"] == "".join(lines)
    assert len(docs["val"].splitlines()) == pytest.approx(20, abs=2)
    assert len(docs["test"].splitlines()) == pytest.approx(10, abs=2)


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda p: p / "missing", "does not exist"),
        (lambda p: (p / "empty_dir").mkdir() or p / "empty_dir", "contains no files"),
        (lambda p: write_tree(p / "d", {"a.txt": "", "b.txt": ""}), "files are empty"),
        (lambda p: write_tree(p / "d", {"a.txt": "x", "b.txt": "y"}), "at least 3"),
        (lambda p: write_tree(p, {"e.txt": ""}) / "e.txt", "is empty"),
        (lambda p: write_tree(p, {"e.jsonl": "\n"}) / "e.jsonl", "no non-empty"),
    ],
)
def test_empty_or_missing_sources_are_errors_naming_the_path(tmp_path, make, match):
    path = make(tmp_path)
    with pytest.raises(ValueError, match=match) as info:
        open_source(DataConfig(source=str(path))).splits(0.02, 0.02)
    assert str(path) in str(info.value)


def test_non_text_and_unreadable_files_are_errors_naming_the_file(tmp_path, monkeypatch):
    write_tree(tmp_path, {"a.txt": "a", "b.txt": "b", "c.txt": "c"})
    (tmp_path / "blob.bin").write_bytes(b"\xff\xfe\x00\x01binary")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9\n".encode("latin-1"))
    source = open_source(DataConfig(source=str(tmp_path)))
    with pytest.raises(ValueError, match="blob.bin is not a text file"):
        read_all(source)
    (tmp_path / "blob.bin").unlink()
    with pytest.raises(ValueError, match="latin1.txt is not UTF-8"):
        read_all(open_source(DataConfig(source=str(tmp_path))))
    (tmp_path / "latin1.txt").unlink()

    def refuse(self):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "read_bytes", refuse)  # root ignores chmod, so simulate the refusal
    with pytest.raises(ValueError, match=r"cannot read .*a\.txt: Permission denied"):
        read_all(open_source(DataConfig(source=str(tmp_path))))


@pytest.mark.parametrize(
    "lines, match",
    [
        (['{"text": "ok"}', "{not json"], r"bad.jsonl:2: invalid JSON"),
        (['{"text": "ok"}', '{"body": "x"}'], r"bad.jsonl:2: no field 'text' \(found \['body'\]\)"),
        (['{"text": 3}'], r"bad.jsonl:1: field 'text' is int"),
        (['["text"]'], r"bad.jsonl:1: no field 'text'"),
    ],
)
def test_bad_jsonl_is_an_error_naming_file_and_line(tmp_path, lines, match):
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=match):
        open_source(DataConfig(source=str(path)))


def test_missing_datasets_package_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` fail
    with pytest.raises(ImportError, match=r"tapa-attention\[datasets\]"):
        open_source(DataConfig(source="hf:some/dataset"))


def test_hf_load_from_disk_directory(tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = {"text": [f"row number {i}\n" for i in range(12)]}
    datasets.Dataset.from_dict(rows).save_to_disk(str(tmp_path / "saved"))
    source = open_source(DataConfig(source=f"hf:{tmp_path / 'saved'}"))
    assignment, docs = read_all(source)
    assert sorted(docs.values()) == sorted(rows["text"])
    assert sorted(set(assignment.values())) == ["test", "train", "val"]
    with pytest.raises(ValueError, match="no column 'body'"):
        open_source(DataConfig(source=f"hf:{tmp_path / 'saved'}", text_field="body"))
    with pytest.raises(ValueError, match="does not exist"):
        open_source(DataConfig(source=f"hf:{tmp_path / 'nowhere'}"))
    # a DatasetDict with its own splits keeps them
    parts = {name: datasets.Dataset.from_dict({"text": [f"{name} {i}" for i in range(n)]})
             for name, n in (("train", 5), ("validation", 2), ("test", 3))}
    datasets.DatasetDict(parts).save_to_disk(str(tmp_path / "dict"))
    assignment, docs = read_all(open_source(DataConfig(source=f"hf:{tmp_path / 'dict'}")))
    for key, split in assignment.items():
        assert docs[key].split()[0] == {"train": "train", "val": "validation", "test": "test"}[split]
    assert len(docs) == 10


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"vocab_size": 100}, "vocab_size"),
        ({"val_fraction": -0.1}, "val_fraction"),
        ({"val_fraction": 0.6, "test_fraction": 0.5}, "val_fraction \\+ test_fraction"),
        ({"max_train_bytes": 0}, "max_train_bytes"),
        ({"source": ""}, "source"),
    ],
)
def test_bad_config_values_name_the_argument(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DataConfig(**kwargs)


def test_config_round_trips_through_a_dict(tmp_path, monkeypatch):
    monkeypatch.setenv("TAPA_CACHE", str(tmp_path))
    cfg = DataConfig(vocab_size=512, max_train_bytes=1000)
    assert cfg.cache_dir == str(tmp_path / "data")
    assert DataConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="unknown DataConfig fields"):
        DataConfig.from_dict({"sauce": "x"})
