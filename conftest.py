"""Shared setup of every test, tests/ and lab/ alike (pytest loads this file first):

- tests/helpers.py importable as `helpers`, and the repository root on sys.path (`import lab....`);
- without CUDA, Triton kernels can only run in its CPU interpreter. The variable must be set before
  triton is first imported, so it is set here, once, for the whole session.
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

ROOT = Path(__file__).resolve().parent
for path in (ROOT / "tests", ROOT):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))
