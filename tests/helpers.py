"""Helpers shared by the tests (importable as `helpers`; conftest.py puts this
folder on sys.path)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import torch

ROOT = Path(__file__).resolve().parents[1]


def load_file(path: Path, name: str) -> ModuleType:
    """A Python file outside the package (scripts/, examples/) imported as module `name`."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def rel_rmse(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """Relative RMSE ||actual - expected|| / ||expected||, computed in float64."""
    actual = actual.detach().to(torch.float64)
    expected = expected.detach().to(torch.float64)
    if actual.shape != expected.shape:
        raise ValueError(f"shapes differ: {tuple(actual.shape)} vs {tuple(expected.shape)}")
    denominator = expected.norm()
    if denominator == 0:
        raise ValueError("expected is all zeros: relative error undefined")
    return float((actual - expected).norm() / denominator)


def python_like_text(lines: int) -> str:
    """A deterministic Python-looking corpus of 2 * lines lines (independent of the interpreter)."""
    return "".join(f"def function_{i}(value):\n    return value * {i % 7} + {i % 13}  # line {i}\n"
                   for i in range(lines))


def earlier_phase_layout(lm, weights: dict) -> dict:
    """`weights` (a TapaLM's, bare or under a prefix such as transformers' "model.") as they were
    stored before TAPA's phase rows became parameters of their own: one wq / wk per layer, each
    head's amplitude then phase rows."""
    old = {}
    for name, tensor in weights.items():
        if "_phase" in name:
            continue
        if name.endswith(("attn.wq.weight", "attn.wk.weight")):
            layer = int(name.split("layers.")[1].split(".")[0])
            tensor = lm.layers[layer].attn.projection_weight(name.split(".")[-2][1]).detach().clone()
        old[name] = tensor
    return old


# Tokenizers of the passkey and retrieval-task tests: bytes, and variable-width words


def char_encode(text: str) -> list[int]:
    return list(text.encode())


def char_decode(ids) -> str:
    return bytes(i for i in ids if i < 256).decode(errors="replace")


class WordTokenizer:
    """Variable-width tokens (words with their leading space, punctuation, digit runs)."""

    def __init__(self):
        self.vocab: dict[str, int] = {}
        self.pieces: list[str] = []

    def encode(self, text):
        ids = []
        for piece in re.findall(r" ?\w+| ?[^\w\s]|\s", text):
            if piece not in self.vocab:
                self.vocab[piece] = len(self.pieces)
                self.pieces.append(piece)
            ids.append(self.vocab[piece])
        return ids

    def decode(self, ids):
        return "".join(self.pieces[i] if i < len(self.pieces) else "?" for i in ids)


def find(sequence, pattern, start: int = 0) -> int:
    """The first index at or after start where pattern occurs in sequence (AssertionError if none)."""
    for index in range(start, len(sequence) - len(pattern) + 1):
        if sequence[index:index + len(pattern)] == pattern:
            return index
    raise AssertionError("pattern not found")


def one_line_error(argv, match: str) -> str:
    """`tapa` main(argv) must stop with one `tapa CMD: error: ...` line matching the regex `match`
    (a SystemExit carrying the message, no traceback); returns the line."""
    import pytest

    from tapa.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    message = str(exit_info.value.code)
    assert message.startswith(f"tapa {argv[0]}: error: ") and "\n" not in message, message
    assert re.search(match, message), message
    return message


def tiny_run(root: Path, name: str = "run", **train) -> Path:
    """A 2-step CPU training run (dim 32, one layer, BPE-300 on Python-like text) in root/name,
    its corpus and token cache beside it; `train`: TrainConfig fields to change."""
    from tapa.data import DataConfig
    from tapa.model import ModelConfig
    from tapa.train import TrainConfig, train as train_run

    (root / "corpus.txt").write_text(python_like_text(2000))
    values = dict(name="x", run_dir=str(root / name), seq_len=32, batch_size=2, steps=2, warmup_steps=1,
                  eval_every=0, save_every=0, eval_batches=1, log_every=1, progress=False, plot=False,
                  device="cpu")
    return train_run(TrainConfig(**{**values, **train}), ModelConfig(dim=32, n_layers=1, n_heads=2),
                     DataConfig(source=str(root / "corpus.txt"), cache_dir=str(root / "cache"),
                                vocab_size=300, val_fraction=0.1, test_fraction=0.1))


class ContextReader(torch.nn.Module):
    """A stub language model over char tokens (`char_encode`) that keeps its context in the KV
    cache, as the retrieval evaluations drive a model, and writes after the context's last `cue`
    the text `reply(context)` returns as (text, cue): one char a step."""

    def __init__(self):
        from types import SimpleNamespace

        super().__init__()
        self.config = SimpleNamespace(pe="tapa", n_layers=1, rope_scale=1.0)
        self.weight = torch.nn.Parameter(torch.zeros(1))

    def new_kv_cache(self, batch, max_len):
        from tapa.model import KVCache, ModelConfig

        return KVCache(ModelConfig(n_layers=1), batch, max_len)

    def reply(self, context: str) -> tuple[str, str]:
        raise NotImplementedError

    def forward(self, ids, start_pos=0, kv_cache=None, logits_to_keep=0):
        history, _, _ = kv_cache.update(0, ids[:, :, None, None].float(), ids[:, :, None, None].float(), start_pos)
        kv_cache.advance(ids.shape[1])
        logits = torch.full((*ids.shape, 256), -1e4)
        for b, row in enumerate(history[:, :, 0, 0].long().tolist()):
            context = char_decode(row)
            text, cue = self.reply(context)
            produced = context.rsplit(cue, 1)[1]
            logits[b, -1, ord(text[len(produced)])] = 0.0
        return logits[:, -logits_to_keep:] if logits_to_keep else logits
