"""Kernel configs other than the table's, from text: `parse_variant("dq_atomic=1,dkdv=64x128/8/2")`
gives the `KernelConfigs` field changes, `variant_configs` applies them to a row of the table.

Keys are `tapa.ops.tapa.configs.KernelConfigs`' field names. Tiles (fwd, fwd_long, dkdv, dq) are
BMxBN[/warps[/stages]][/rN] (rN: a cap of N registers a thread); flags 0 or 1; fwd_split_s 0, 1 or
2; taylor_order 1..6; taylor_tolerance a float; fwd_long_from a key count. A `fwd` change without a
`fwd_long` one sets the forward's tile at every key length. The rows' own checks then refuse what
the kernels do not take.
"""

from __future__ import annotations

import dataclasses

import torch

from tapa.ops.tapa.configs import KernelConfigs, Tile, lookup

TILES = ("fwd", "fwd_long", "dkdv", "dq")
FIELDS = {f.name: f.type for f in dataclasses.fields(KernelConfigs)}


def parse_tile(key: str, text: str) -> Tile:
    """'128x64/8/3' (warps and stages optional, 4 and 2 by default; then '/rN' for a cap of N
    registers a thread)."""
    parts = text.split("/")
    max_registers = 0
    if len(parts) > 1 and parts[-1].startswith("r"):
        cap = parts.pop()[1:]
        if not cap.isdigit():
            raise ValueError(f"kernel variant {key}={text!r}: a register cap is r24 .. r248 in "
                             "steps of 8, e.g. r168")
        max_registers = int(cap)
    try:
        block_m, block_n = (int(x) for x in parts[0].split("x"))
        numbers = [int(x) for x in parts[1:]]
    except ValueError:
        numbers = None
    if numbers is None or len(numbers) > 2:
        raise ValueError(f"kernel variant {key}={text!r}: expected BMxBN[/warps[/stages]][/rN], "
                         "e.g. 128x64/8/3")
    warps, stages = (numbers + [4, 2][len(numbers):])[:2]
    try:
        return Tile(block_m, block_n, warps, stages, max_registers)
    except ValueError as err:
        raise ValueError(f"kernel variant {key}={text!r}: {err}") from None


def parse_variant(spec: str) -> dict:
    """`KernelConfigs` field changes from 'key=value,key=value'; ValueError on a bad one. An empty
    spec changes nothing."""
    changes: dict = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        key, sep, text = item.partition("=")
        key, text = key.strip(), text.strip()
        if not sep or key not in FIELDS:
            raise ValueError(f"kernel variant {item!r}: expected key=value with key one of {sorted(FIELDS)}")
        kind = FIELDS[key]
        if kind == "Tile":
            changes[key] = parse_tile(key, text)
        elif kind == "bool":
            if text not in ("0", "1"):
                raise ValueError(f"kernel variant {key}={text!r}: expected 0 or 1")
            changes[key] = text == "1"
        elif kind == "int":
            if not text.isdigit():
                raise ValueError(f"kernel variant {key}={text!r}: expected a non-negative integer")
            changes[key] = int(text)
        else:
            try:
                changes[key] = float(text)
            except ValueError:
                raise ValueError(f"kernel variant {key}={text!r}: expected a number") from None
    return changes


def variant_text(changes: dict) -> str:
    """The spec `parse_variant` reads back into these changes."""
    return ",".join(f"{key}={int(value) if isinstance(value, bool) else value}"
                    for key, value in changes.items())


def with_variant(configs: KernelConfigs, changes: dict | str) -> KernelConfigs:
    """configs with the changes (or a spec's) applied; a `fwd` change without a `fwd_long` one
    sets the forward's tile at every key length."""
    changes = parse_variant(changes) if isinstance(changes, str) else changes
    if "fwd" in changes and "fwd_long" not in changes:
        changes = {**changes, "fwd_long": changes["fwd"]}
    try:
        return dataclasses.replace(configs, **changes)
    except ValueError as err:
        raise ValueError(f"kernel variant {variant_text(changes)}: {err}") from None


def variant_configs(changes: dict | str, head_dim: int, dtype: torch.dtype = torch.bfloat16) -> KernelConfigs:
    """The GPU row of the table at head_dim and dtype with the changes applied."""
    return with_variant(lookup("cuda", dtype, head_dim), changes)
