"""The fused kernels' config table (`tapa.ops.tapa.configs`), row by row: each row's values are what
the kernels take, `lookup` finds each row for its (architecture, dtype, head dim) classes, and each
row's kernels match the float64 reference within the bar (on CPU under Triton's interpreter, in
float16 for the 16-bit rows and float32 for the others, with fresh random inputs and ragged
lengths). Nothing here pins a row's values: the table says what ships, these tests that it works."""

from __future__ import annotations

import dataclasses
import inspect
import zlib
from dataclasses import replace

import pytest
import torch

pytest.importorskip("triton")

from fused_checks import HALF_BAR, check, inputs  # noqa: E402

from tapa.ops.tapa import configs as table, kernels, launch  # noqa: E402
from tapa.ops.tapa.configs import DECODE, KernelConfigs, Tile, lookup  # noqa: E402

ROWS = {name: row for name, row in vars(table).items() if isinstance(row, KernelConfigs)}
DTYPES = {"16bit": (torch.float16, torch.bfloat16), "float32": (torch.float32,)}


def test_every_row_is_in_the_table_and_named():
    """The table's values are the module's named rows, and every named row is in the table."""
    assert set(map(id, table.TABLE.values())) == set(map(id, ROWS.values()))
    assert {key[0] for key in table.TABLE} == set(table.ARCH_CLASSES)
    keys = {(arch, dtype, width) for arch in table.ARCH_CLASSES for dtype in table.DTYPE_CLASSES
            for width in table.HEAD_DIM_CLASSES}
    assert set(table.TABLE) == keys


def _constexpr_names(kernel) -> set[str]:
    signature = inspect.signature(kernel.fn)
    return {name for name, p in signature.parameters.items()
            if p.annotation is not inspect.Parameter.empty and "constexpr" in str(p.annotation)}


@pytest.mark.parametrize("name", ROWS)
def test_row_values_are_what_the_kernels_take(name):
    """A row passes its own checks again, and the constexprs the launches derive from it are
    exactly those each kernel declares (no flag the kernel ignores, none it lacks)."""
    row = ROWS[name]
    assert replace(row) == row  # the constructor's checks
    for tile in {row.fwd, row.fwd_long, row.dkdv, row.dq}:
        assert tile.launch_options()["num_warps"] == tile.num_warps
        assert ("maxnreg" in tile.launch_options()) == bool(tile.max_registers)
    for dtype in DTYPES["16bit" if name.endswith("16BIT") else "float32"]:
        q = torch.zeros(1, 8, 2, 64, dtype=dtype)
        _, logit_flags = launch._common_args(q, q, q, 32, 0.1, "power", "quadratic", True, 0, 0, row)
        common = {"BLOCK_M", "BLOCK_N", *logit_flags}  # the tiles, and what every launch passes
        for kernel, own in ((kernels._fwd_kernel, launch.fwd_flags),
                            (kernels._bwd_dkdv_kernel, launch.dkdv_flags),
                            (kernels._bwd_dq_kernel, launch.dq_flags)):
            assert common | set(own(row, logit_flags)) == _constexpr_names(kernel), kernel
    assert row.describe().count("=") == len(dataclasses.fields(row))


@pytest.mark.parametrize("changes, message", [
    (dict(taylor_order=7), "taylor_order must be 1..6"),
    (dict(taylor_tolerance=0.1), "taylor_tolerance"),
    (dict(far_bands=True, taylor_order=6), "the bands take taylor_order 2..5"),
    (dict(fwd_split_s=3), "fwd_split_s must be 0, 1 or 2"),
    (dict(fwd_split_s=True), "fwd_split_s must be 0, 1 or 2"),
    (dict(fwd_split_s=2, taylor_order=4), "taylor_order 1..3"),
    (dict(fwd_split_s=2, far_bands=True, taylor_order=3), "taylor_order 1..2 with far_bands"),
    (dict(dq_transpose=True, dq_atomic=False), "dq_atomic=True"),
    (dict(trig_poly=True, dkdv_cos_radians=True), "MUFU"),
    (dict(dq_atomic=1), "must be True or False"),
    (dict(fwd_long_from=0), "fwd_long_from"),
    (dict(fwd=(64, 64, 4, 2)), "must be a Tile"),
])
def test_a_combination_the_kernels_do_not_take_is_refused(changes, message):
    with pytest.raises(ValueError, match=message):
        replace(table.INTERPRETER, **changes)


@pytest.mark.parametrize("args, message", [
    ((48, 64, 4, 2), "power of two"), ((64, 8, 4, 2), ">= 16"), ((64, 64, 3, 2), "power of two"),
    ((64, 64, 4, 0), "num_stages"), ((64, 64, 4, 2, 100), "max_registers"),
    ((64, 64, 4, 2, 256), "max_registers")])
def test_a_tile_the_kernels_do_not_take_is_refused(args, message):
    with pytest.raises(ValueError, match=message):
        Tile(*args)


def test_lookup_finds_each_row():
    """Every key's row, from dtypes and head dims of its classes (the largest head dim of a class
    and the smallest, v's head dim counting as much as q's); others are refused."""
    lower = dict(zip(table.HEAD_DIM_CLASSES, (1, *(w + 1 for w in table.HEAD_DIM_CLASSES[:-1]))))
    for (arch, dtype_class, width), row in table.TABLE.items():
        for dtype in DTYPES[dtype_class]:
            for head_dim, v_dim in ((width, width), (lower[width], lower[width]),
                                    (lower[width], width), (width, lower[width]), (width, None)):
                assert lookup(arch, dtype, head_dim, v_dim) is row, (arch, dtype, head_dim, v_dim)
    with pytest.raises(ValueError, match="head dims <= 256"):
        lookup("cuda", torch.float16, 64, 320)
    with pytest.raises(ValueError, match="float16, bfloat16 or float32"):
        lookup("cuda", torch.float64, 64)
    with pytest.raises(ValueError, match="arch must be one of"):
        lookup("hopper", torch.float16, 64)
    q, v = torch.zeros(1, 1, 1, 64), torch.zeros(1, 1, 1, 32)
    assert launch.configs_for(q, v) is lookup(launch.arch_class(), torch.float32, 64)


@pytest.mark.parametrize("name", ROWS)
def test_row_forward_tile_by_key_length(name):
    row = ROWS[name]
    limit = row.fwd_long_from
    assert [row.forward_tile(n) for n in (1, limit, limit + 1)] == [row.fwd, row.fwd, row.fwd_long]


def _row_cases() -> list[tuple[str, torch.dtype, int]]:
    """(row, dtype, head_dim) of each CUDA key of each row (the interpreter's row: at the smallest
    head-dim class, in both dtypes): float16 for the 16-bit keys (the interpreter's bfloat16 dot is
    not trustworthy), the key's head-dim class."""
    cases = []
    for name, row in ROWS.items():
        keys = [key for key, each in table.TABLE.items() if each is row]
        keys = ([key for key in keys if key[0] == "cuda"]
                or [key for key in keys if key[2] == table.HEAD_DIM_CLASSES[0]])
        cases += [(name, torch.float16 if dtype == "16bit" else torch.float32, width)
                  for _, dtype, width in keys]
    return cases


# (q_offset, causal): near the diagonal, and far from it (every band of a far_bands row: outer,
# order 2, farthest), causal and not
OFFSETS = [(0, True), (700, True), (2500, False), (8000, True)]


@pytest.mark.parametrize("offset, causal", OFFSETS, ids=[f"offset{o}-{'causal' if c else 'full'}"
                                                        for o, c in OFFSETS])
@pytest.mark.parametrize("name, dtype, head_dim", _row_cases(),
                         ids=[f"{n}-{str(d).removeprefix('torch.')}-D{w}" for n, d, w in _row_cases()])
def test_row_matches_the_reference(name, dtype, head_dim, offset, causal):
    """Each row's kernels (both forward tiles: fwd_long_from lowered to 40 keys for a second
    call) against float64: out and every gradient within the half-precision bar (float32: float32
    accuracy), lse within what the row's series and trig allow. Inputs drawn for each row and
    case, ragged lengths (45 and 53 keys in tiles of 16..128), GQA."""
    row = ROWS[name]
    seed = zlib.crc32(f"{name}/{dtype}/{head_dim}/{offset}".encode())
    q, k, v = inputs(1, 45, 45, 4, 2, head_dim, head_dim, dtype, seed)
    kwargs = dict(causal=causal, q_offset=offset) if causal else dict(causal=False, k_offset=offset)
    check(q, k, v, seed=seed, configs=row, bar=HALF_BAR, **kwargs)
    if row.fwd_long != row.fwd:
        q, k, v = inputs(1, 37, 53, 2, 1, head_dim, head_dim, dtype, seed + 1)
        kwargs = dict(causal=causal, q_offset=offset + 16) if causal else dict(causal=False)
        check(q, k, v, seed=seed, configs=replace(row, fwd_long_from=40), bar=HALF_BAR, **kwargs)


def test_decode_configs():
    """The decode kernel's autotuned tiles come from DECODE, and its split alignment is a multiple
    of each tile's BLOCK_N."""
    from tapa.ops.tapa import decode_kernel

    assert [(c.kwargs["BLOCK_N"], c.num_warps) for c in decode_kernel._TUNED_CONFIGS] == list(DECODE.tiles)
    assert all(DECODE.split_align % block_n == 0 for block_n, _ in DECODE.tiles)
    assert decode_kernel.SPLIT_ALIGN == DECODE.split_align
