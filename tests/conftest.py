"""Shared test setup: make tests/helpers.py importable as `helpers` from every test folder."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
