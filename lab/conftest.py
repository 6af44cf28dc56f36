"""Shared setup of the lab's tests (`pytest lab` from the repository root), as tests/conftest.py:

- the repository root on sys.path (`import lab....`) and tests/ (its helpers.py as `helpers`);
- without CUDA, Triton kernels run in its CPU interpreter (set before triton is first imported).
"""

import os
import sys
from pathlib import Path

import pytest

try:
    import torch
except ImportError:  # the test environment was not installed: say how, in one line
    raise pytest.UsageError('torch is not installed in this Python: run the README\'s commands, '
                            'pip install torch==2.13.0 && pip install -e ".[test]"') from None

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT / "tests", ROOT):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))
