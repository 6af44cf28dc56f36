"""Lazy imports of optional dependencies, with an error that names the extra to install."""

from __future__ import annotations

import importlib
from types import ModuleType

# module name -> the pip extra of tapa-attention that provides it
_EXTRA_FOR = {
    "triton": "triton",
    "tokenizers": "train",
    "safetensors": "train",
    "tqdm": "train",
    "matplotlib": "plot",
    "transformers": "hf",
    "datasets": "datasets",
}


def require(module: str) -> ModuleType:
    """Import `module` or raise ImportError telling the user which extra to install."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        top = module.split(".")[0]
        extra = _EXTRA_FOR.get(top, "all")
        raise ImportError(
            f"tapa needs the optional package '{top}' for this feature; "
            f"install it with: pip install 'tapa-attention[{extra}]'"
        ) from err


def available(module: str) -> bool:
    try:
        importlib.import_module(module)
        return True
    except ImportError:
        return False
