"""Byte-level BPE tokenizer (the `tokenizers` library): train, save, load, hash.

The BPE works on the 256 byte values (GPT-2's byte-to-unicode map, so any text round-trips) with
GPT-2's pre-tokenization regex, plus one special token, <|endoftext|>, that separates documents in
the token cache. The special token is only ever inserted by the cache builder: `encode` treats a
literal "<|endoftext|>" inside a text as ordinary characters.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

from tapa._optional import require
from tapa._paths import file_sha256

EOT_TOKEN = "<|endoftext|>"
TOKENIZER_FILE = "tokenizer.json"


def _prepare(tokenizer) -> None:
    # literal "<|endoftext|>" in a document is text, not a separator (attribute since tokenizers 0.19)
    if hasattr(tokenizer, "encode_special_tokens"):
        tokenizer.encode_special_tokens = True


def train_bpe(texts: Iterable[str], vocab_size: int, *, length: int | None = None, progress: bool = True):
    """Train a byte-level BPE with `vocab_size` entries (256 bytes + <|endoftext|> + merges)."""
    tk = require("tokenizers")
    tokenizer = tk.Tokenizer(tk.models.BPE())
    tokenizer.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = tk.decoders.ByteLevel()
    trainer = tk.trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOT_TOKEN],
        initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet(),
        show_progress=progress,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer, length=length)
    _prepare(tokenizer)
    return tokenizer


def save_tokenizer(tokenizer, directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / TOKENIZER_FILE
    tokenizer.save(str(path))
    return path


def tokenizer_file(directory: str | Path) -> Path:
    """The tokenizer.json inside a tokenizer directory (or the file itself), checked to exist."""
    path = Path(directory).expanduser()
    if path.is_dir():
        path = path / TOKENIZER_FILE
    if not path.is_file():
        raise ValueError(f"tokenizer {directory}: no {TOKENIZER_FILE} found at {path}")
    return path


def load_tokenizer(directory: str | Path):
    """Load tokenizer.json from a directory (a cache's tokenizer/ or any local tokenizer dir)."""
    tk = require("tokenizers")
    path = tokenizer_file(directory)
    try:
        tokenizer = tk.Tokenizer.from_file(str(path))
    except Exception as err:  # the Rust side raises a plain Exception on bad JSON
        raise ValueError(f"cannot load tokenizer {path}: {err}") from err
    _prepare(tokenizer)
    return tokenizer


def end_of_text_token(tokenizer, directory: Path | None = None) -> str:
    """The document separator: <|endoftext|> if the vocabulary has it, else the eos_token that
    an existing tokenizer directory declares (tokenizer_config.json / special_tokens_map.json)."""
    if tokenizer.token_to_id(EOT_TOKEN) is not None:
        return EOT_TOKEN
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        path = directory / name if directory is not None else None
        if path is not None and path.is_file():
            eos = json.loads(path.read_text(encoding="utf-8")).get("eos_token")
            if isinstance(eos, dict):
                eos = eos.get("content")
            if isinstance(eos, str) and tokenizer.token_to_id(eos) is not None:
                return eos
    raise ValueError(
        f"tokenizer {directory}: it has no {EOT_TOKEN} token and declares no eos_token; "
        "documents need a separator token"
    )
