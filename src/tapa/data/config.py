"""DataConfig: which text to use, how to split it, and how to tokenize it."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path

from tapa._config import from_dict

SPLITS = ("train", "val", "test")


def default_cache_dir() -> str:
    """<$TAPA_CACHE or ~/.cache/tapa>/data, read when a DataConfig is made."""
    root = os.environ.get("TAPA_CACHE") or "~/.cache/tapa"
    return str(Path(root) / "data")


@dataclass
class DataConfig:
    """What `build_corpus` builds.

    source: "builtin" (the .py files of this interpreter's stdlib), a path to a text file, a
        directory of text files or a .jsonl file, or "hf:<name or load_from_disk directory>".
    tokenizer: an existing tokenizer directory (holding tokenizer.json); None trains a byte-level
        BPE of `vocab_size` on the train split.
    max_train_bytes: keep only this many bytes of the train split (its documents in order, the
        last one cut), for quick runs; val and test are not capped.
    tokenizer_train_bytes: train the BPE on only the first this-many bytes of the train split
        (in source order); None uses the whole train split (the stdlib's 30 MB take ~15 s).
    """

    source: str = "builtin"
    cache_dir: str = field(default_factory=default_cache_dir)
    vocab_size: int = 8192
    tokenizer: str | None = None
    include_site_packages: bool = False
    text_field: str = "text"
    val_fraction: float = 0.02
    test_fraction: float = 0.02
    max_train_bytes: int | None = None
    tokenizer_train_bytes: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.source, str) or not self.source.strip():
            raise ValueError(f"source must be a non-empty string, got {self.source!r}")
        if not isinstance(self.vocab_size, int) or self.vocab_size < 258:
            # 256 byte symbols + <|endoftext|> + at least one merge
            raise ValueError(f"vocab_size must be an int >= 258, got {self.vocab_size!r}")
        for name in ("val_fraction", "test_fraction"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {value!r}")
        if self.val_fraction + self.test_fraction >= 1.0:
            raise ValueError(
                f"val_fraction + test_fraction must be < 1, got "
                f"{self.val_fraction} + {self.test_fraction}"
            )
        for name in ("max_train_bytes", "tokenizer_train_bytes"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value <= 0):
                raise ValueError(f"{name} must be a positive int or None, got {value!r}")
        if not self.text_field:
            raise ValueError("text_field must be a non-empty string")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> "DataConfig":
        return from_dict(cls, values)
