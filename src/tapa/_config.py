"""What the typed config dataclasses share: construction from a dict with every key and value
checked (a typo or a wrongly typed value is an error naming the key), and the help sentence of a
field."""

from __future__ import annotations

import dataclasses
import math
import types
import typing


def documented(default, help: str, **kwargs):
    """A dataclass field with a help sentence (shown by `tapa train --help`)."""
    return dataclasses.field(default=default, metadata={"help": help}, **kwargs)


def _allowed_types(hint) -> tuple[tuple[type, ...], bool] | None:
    """(scalar types, None allowed) of a field's type hint; None for hints not checked here."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        scalars = tuple(a for a in args if a is not type(None))
        return (scalars, type(None) in args) if all(isinstance(a, type) for a in scalars) else None
    return ((hint,), False) if isinstance(hint, type) else None


def _check_value(name: str, value, hint, where: str):
    """`value` converted to the field's type (an int for a float field becomes a float);
    ValueError naming the key if it has another type, or is a non-finite float."""
    allowed = _allowed_types(hint)
    if allowed is None:
        return value
    scalars, optional = allowed
    if value is None:
        if optional:
            return value
    elif isinstance(value, bool):  # bool is an int subclass, but never a number here
        if bool in scalars:
            return value
    elif isinstance(value, int) and int in scalars:
        return value
    elif isinstance(value, (int, float)) and float in scalars:
        if not math.isfinite(value):
            raise ValueError(f"{where}{name} must be a finite number, got {value!r}")
        return float(value)
    elif any(isinstance(value, t) for t in scalars if t not in (int, float, bool)):
        return value
    expected = " or ".join([t.__name__ for t in scalars] + (["None"] if optional else []))
    raise ValueError(f"{where}{name} must be {expected}, got {type(value).__name__} {value!r}")


def check_types(cls, values: dict, where: str = "") -> dict:
    """`values` with every key a field of the dataclass `cls` and every value of its field's type
    (ints accepted for floats; bool is not an int; floats finite). `where` prefixes the messages,
    e.g. "recipe 'tiny.toml' [train] "."""
    hints = typing.get_type_hints(cls)
    known = {field.name for field in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"{where}unknown {cls.__name__} fields: {unknown}")
    return {name: _check_value(name, value, hints[name], where) for name, value in values.items()}


def from_dict(cls, values: dict, where: str = ""):
    """cls(**values), refusing keys that are not fields of the dataclass (a typo is an error) and
    values of the wrong type (check_types)."""
    return cls(**check_types(cls, values, where))


def field_help(field: dataclasses.Field, docstring: str | None = None) -> str | None:
    """The sentence that documents a config field: its metadata "help", else a
    "name: text" paragraph of the class docstring, else None."""
    text = field.metadata.get("help") if field.metadata else None
    if text:
        return text
    paragraph, lines = None, (docstring or "").splitlines()
    for line in lines:
        stripped = line.strip()
        if paragraph is not None:
            if not stripped or (":" in stripped and stripped.split(":")[0].isidentifier()):
                break
            paragraph.append(stripped)
        elif stripped.startswith(f"{field.name}:"):
            paragraph = [stripped[len(field.name) + 1:].strip()]
    return " ".join(paragraph) if paragraph else None
