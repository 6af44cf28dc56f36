"""What the typed config dataclasses share."""

from __future__ import annotations

import dataclasses


def from_dict(cls, values: dict):
    """cls(**values), refusing keys that are not fields of the dataclass (a typo is an error)."""
    known = {field.name for field in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"unknown {cls.__name__} fields: {unknown}")
    return cls(**values)
