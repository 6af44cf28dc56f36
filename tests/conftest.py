"""Shared test setup.

- Makes tests/helpers.py importable as `helpers` from every test folder.
- Without CUDA, Triton kernels can only run in its CPU interpreter. The variable must be set before
  triton is first imported, so it is set here, once, for the whole session.
"""

import os
import sys
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

sys.path.insert(0, str(Path(__file__).parent))
