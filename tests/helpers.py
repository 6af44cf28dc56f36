"""Numeric helpers shared by the tests (importable as `helpers`; tests/conftest.py puts this
folder on sys.path)."""

from __future__ import annotations

import torch


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
