"""Helpers shared by the tests (importable as `helpers`; tests/conftest.py puts this
folder on sys.path)."""

from __future__ import annotations

import importlib.util
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
