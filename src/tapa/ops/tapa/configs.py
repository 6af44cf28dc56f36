"""The fused TAPA kernels' launch configurations: one frozen table of the shipped choices.

A row (`KernelConfigs`) holds every choice the fused kernels take: the tiles of the forward, dK/dV
and dQ kernels, and the code paths each kernel compiles (`tapa.ops.tapa.kernels`). `lookup` picks
the row for an architecture class, a dtype class and a head-dim class; `tapa.ops.tapa.launch`
launches with it, or with a row a caller passes explicitly (`configs=`, for tests and research:
`dataclasses.replace` of a row is checked as the rows are). The decode kernel's own choices are
`DECODE` (`DecodeConfigs`).

Classes of the key:
- architecture: "cuda" (the choices timed on the H200, a Hopper GPU; they run on any CUDA GPU,
  and the forward takes TMA only where the GPU has it) or "interpreter" (Triton's CPU
  interpreter: small tiles, quick on a CPU);
- dtype: "16bit" (float16, bfloat16) or "float32";
- head dim: the smallest of 64, 128, 256 that holds max(head_dim, v_dim).

Why each CUDA row is what it is (the measurements live in docs/kernel-log.md):
- 16-bit D <= 64: a 4-warp 64x64 forward and a 32x64 dK/dV under a 168-register cap (three blocks
  an SM), a 64x32 dQ kernel; the MUFU's cos/sin on the unreduced phase in radians in all three
  kernels, a far tile's scalars from the MUFU, split distances in the forward and the dQ kernel,
  and the far tiles' d ** alpha as an order-2 series at tolerance 1e-5, in the forward in the
  column term and in three bands of orders 1..3: each was faster on Hopper at D=64 with every
  bf16 error unchanged.
- 16-bit D <= 128: the 4-warp 64x64 forward up to 16k keys and an 8-warp 128x64 one above, its K
  and V tiles by TMA; a 32x128 dK/dV kernel that also adds dQ by float32 atomics, its products
  transposed (dQ^T = K^T dS, so that they run on wgmma); the same MUFU trig, series and lean
  forward. Bands, the backward's MUFU scalars and the dQ kernel's split distances did not pay
  at D=128.
- float32 and the wide rows: the plain kernels (polynomial trig, the exact order-6 series at
  1e-8), whose results are float32-grade; tiles that fit the registers and shared memory.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

ARCH_CLASSES = ("cuda", "interpreter")
DTYPE_CLASSES = ("16bit", "float32")
HEAD_DIM_CLASSES = (64, 128, 256)
# The largest head dim (q/k and v) the fused kernels take.
MAX_HEAD_DIM = HEAD_DIM_CLASSES[-1]


@dataclass(frozen=True)
class Tile:
    """One kernel's tile and launch: queries x keys a program (keys x queries in dK/dV), warps,
    pipeline stages, and a register cap a thread (Triton's maxnreg; 0: no cap), which trades
    spills for more blocks an SM."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    max_registers: int = 0

    def __post_init__(self):
        for name in ("block_m", "block_n", "num_warps"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1 or value & (value - 1):
                raise ValueError(f"Tile.{name} must be a power of two, got {value!r}")
        if self.block_m < 16 or self.block_n < 16:
            raise ValueError(f"Tile blocks must be >= 16, got {self.block_m}x{self.block_n}")
        if not isinstance(self.num_stages, int) or self.num_stages < 1:
            raise ValueError(f"Tile.num_stages must be >= 1, got {self.num_stages!r}")
        if self.max_registers and not (24 <= self.max_registers <= 248 and self.max_registers % 8 == 0):
            raise ValueError(f"Tile.max_registers must be 0 (no cap) or 24..248 in steps of 8, "
                             f"got {self.max_registers!r}")

    def __str__(self):
        return (f"{self.block_m}x{self.block_n}/{self.num_warps}/{self.num_stages}"
                + (f"/r{self.max_registers}" if self.max_registers else ""))

    def launch_options(self) -> dict:
        """The launch's compile options: warps, stages and, where set, the register cap."""
        options = dict(num_warps=self.num_warps, num_stages=self.num_stages)
        if self.max_registers:
            options["maxnreg"] = self.max_registers
        return options


@dataclass(frozen=True)
class KernelConfigs:
    """Every choice of the fused kernels (a row of `TABLE`); the constructor refuses a combination
    the kernels do not take.

    Tiles: `fwd` up to `fwd_long_from` keys and `fwd_long` above (the same tile where a row has
    one), `dkdv`, `dq`. Each forward row writes its own lse, so the backward reads the same lse
    from either forward tile.

    Logits (every kernel): `trig_poly` (cos/sin as polynomials on the FMA pipes, else the MUFU's
    cos.approx/sin.approx; the interpreter always takes the polynomials), `taylor_order` and
    `taylor_tolerance` (the far tiles' series of d ** alpha: its degree, 1..6, and relative error
    bound).

    Forward: `far_bands` (the series in three bands, orders taylor_order -/+ 1 in the farthest and
    the nearest; taylor_order 2..5), `fwd_split_s` (0: the distances per score; 1: as each row's
    offset less a column ramp made once; 2: also the far series as a polynomial in the column term,
    taylor_order 1..3, 1..2 with far_bands), `fwd_fast_scalars` (a far tile's log2 and reciprocal
    from the MUFU), `fwd_cos_radians` (the MUFU cos on the unreduced phase in radians; MUFU trig
    only), `fwd_tma` (K and V tiles by TMA descriptors, where the GPU and the tensors allow it).

    dK/dV kernel: `dq_atomic` (it also adds dQ by float32 atomics, and no dQ kernel runs; not in
    torch's deterministic mode, `launch.dq_by_atomics`), `dq_transpose` (those dQ products as
    dQ^T = K^T dS; with dq_atomic only), `dkdv_cos_radians`. Both backward kernels:
    `bwd_fast_scalars`. dQ kernel: `dq_split_s` (its distances split as the forward's 1),
    `dq_cos_radians`.
    """

    fwd: Tile
    fwd_long: Tile
    fwd_long_from: int
    dkdv: Tile
    dq: Tile
    trig_poly: bool
    taylor_order: int
    taylor_tolerance: float
    far_bands: bool
    fwd_split_s: int
    fwd_fast_scalars: bool
    fwd_cos_radians: bool
    fwd_tma: bool
    dq_atomic: bool
    dq_transpose: bool
    dkdv_cos_radians: bool
    bwd_fast_scalars: bool
    dq_split_s: bool
    dq_cos_radians: bool

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.type == "Tile" and not isinstance(value, Tile):
                raise ValueError(f"KernelConfigs.{field.name} must be a Tile, got {value!r}")
            if field.type == "bool" and not isinstance(value, bool):
                raise ValueError(f"KernelConfigs.{field.name} must be True or False, got {value!r}")
        if not isinstance(self.fwd_long_from, int) or self.fwd_long_from < 1:
            raise ValueError(f"KernelConfigs.fwd_long_from must be a positive int, got {self.fwd_long_from!r}")
        order = self.taylor_order
        if not isinstance(order, int) or not 1 <= order <= 6:
            raise ValueError(f"KernelConfigs.taylor_order must be 1..6, got {order!r}")
        if not 0 < self.taylor_tolerance < 1e-2:
            raise ValueError(f"KernelConfigs.taylor_tolerance must be in (0, 1e-2), got {self.taylor_tolerance!r}")
        if self.far_bands and not 2 <= order <= 5:
            raise ValueError(f"far_bands: the bands take taylor_order 2..5 (they are orders "
                             f"taylor_order -/+ 1), got {order}")
        if self.fwd_split_s not in (0, 1, 2) or isinstance(self.fwd_split_s, bool):
            raise ValueError(f"KernelConfigs.fwd_split_s must be 0, 1 or 2, got {self.fwd_split_s!r}")
        top = 2 if self.far_bands else 3  # the bands' outer series is one order more
        if self.fwd_split_s == 2 and not 1 <= order <= top:
            raise ValueError(f"fwd_split_s=2 (the column-term series) takes taylor_order 1..{top}"
                             f"{' with far_bands' if self.far_bands else ''}, got {order}")
        if self.dq_transpose and not self.dq_atomic:
            raise ValueError("dq_transpose: the transposed dQ products are the atomic dQ's "
                             "(dq_atomic=True)")
        radians = [name for name in ("fwd_cos_radians", "dkdv_cos_radians", "dq_cos_radians")
                   if getattr(self, name)]
        if radians and self.trig_poly:
            raise ValueError(f"{', '.join(radians)}: the cos in radians is the MUFU's "
                             "(trig_poly=False)")

    def describe(self) -> str:
        """One line of every field, name=value (tiles as BMxBN/warps/stages[/rN])."""
        return ",".join(f"{f.name}={int(v) if isinstance(v, bool) else v}"
                        for f in dataclasses.fields(self) for v in (getattr(self, f.name),))

    def forward_tile(self, n_k: int) -> Tile:
        """The forward's tile for n_k keys."""
        return self.fwd_long if n_k > self.fwd_long_from else self.fwd


def _plain(fwd: Tile, dkdv: Tile, dq: Tile) -> KernelConfigs:
    """The plain kernels on these tiles: polynomial trig, the order-6 series at 1e-8, nothing
    else (float32-grade results)."""
    return KernelConfigs(
        fwd=fwd, fwd_long=fwd, fwd_long_from=16384, dkdv=dkdv, dq=dq,
        trig_poly=True, taylor_order=6, taylor_tolerance=1e-8, far_bands=False,
        fwd_split_s=0, fwd_fast_scalars=False, fwd_cos_radians=False, fwd_tma=False,
        dq_atomic=False, dq_transpose=False, dkdv_cos_radians=False, bwd_fast_scalars=False,
        dq_split_s=False, dq_cos_radians=False)


# ---------------------------------------------------------------------------------------------
# The table

D64_16BIT = KernelConfigs(
    fwd=Tile(64, 64, 4, 2, max_registers=168), fwd_long=Tile(64, 64, 4, 2, max_registers=168),
    fwd_long_from=16384, dkdv=Tile(32, 64, 4, 2, max_registers=168), dq=Tile(64, 32, 4, 2),
    trig_poly=False, taylor_order=2, taylor_tolerance=1e-5, far_bands=True,
    fwd_split_s=2, fwd_fast_scalars=True, fwd_cos_radians=True, fwd_tma=False,
    dq_atomic=False, dq_transpose=False, dkdv_cos_radians=True, bwd_fast_scalars=True,
    dq_split_s=True, dq_cos_radians=True)
D128_16BIT = KernelConfigs(
    fwd=Tile(64, 64, 4, 2), fwd_long=Tile(128, 64, 8, 3), fwd_long_from=16384,
    dkdv=Tile(32, 128, 8, 2), dq=Tile(128, 16, 8, 2),
    trig_poly=False, taylor_order=2, taylor_tolerance=1e-5, far_bands=False,
    fwd_split_s=2, fwd_fast_scalars=True, fwd_cos_radians=True, fwd_tma=True,
    dq_atomic=True, dq_transpose=True, dkdv_cos_radians=True, bwd_fast_scalars=False,
    dq_split_s=False, dq_cos_radians=False)
D64_FLOAT32 = _plain(Tile(128, 64, 8, 3), Tile(32, 128, 8, 2), Tile(128, 16, 8, 2))
WIDE = _plain(Tile(64, 64, 4, 2), Tile(16, 64, 4, 2), Tile(64, 16, 4, 2))
WIDEST = _plain(Tile(32, 32, 4, 1), Tile(16, 32, 4, 1), Tile(32, 16, 4, 1))
INTERPRETER = _plain(Tile(32, 16, 4, 2), Tile(16, 32, 4, 2), Tile(32, 16, 4, 2))

# (architecture class, dtype class, head-dim class) -> the row the kernels launch with
TABLE: dict[tuple[str, str, int], KernelConfigs] = {
    ("cuda", "16bit", 64): D64_16BIT,
    ("cuda", "16bit", 128): D128_16BIT,
    ("cuda", "16bit", 256): WIDE,
    ("cuda", "float32", 64): D64_FLOAT32,
    ("cuda", "float32", 128): WIDE,
    ("cuda", "float32", 256): WIDEST,
    **{("interpreter", dtype, width): INTERPRETER
       for dtype in DTYPE_CLASSES for width in HEAD_DIM_CLASSES},
}


def dtype_class(dtype: torch.dtype) -> str:
    if dtype in (torch.float16, torch.bfloat16):
        return "16bit"
    if dtype == torch.float32:
        return "float32"
    raise ValueError(f"the fused TAPA kernels take float16, bfloat16 or float32, got {dtype}")


def head_dim_class(head_dim: int, v_dim: int | None = None) -> int:
    width = max(head_dim, head_dim if v_dim is None else v_dim)
    for limit in HEAD_DIM_CLASSES:
        if width <= limit:
            return limit
    raise ValueError(f"the fused TAPA kernels take head dims <= {MAX_HEAD_DIM}, got {width}")


def lookup(arch: str, dtype: torch.dtype, head_dim: int, v_dim: int | None = None) -> KernelConfigs:
    """The table's row for an architecture class ("cuda" or "interpreter"), a dtype and head dims
    (v_dim: the value head dim, default head_dim)."""
    if arch not in ARCH_CLASSES:
        raise ValueError(f"arch must be one of {ARCH_CLASSES}, got {arch!r}")
    return TABLE[arch, dtype_class(dtype), head_dim_class(head_dim, v_dim)]


# ---------------------------------------------------------------------------------------------
# The decode kernel


@dataclass(frozen=True)
class DecodeConfigs:
    """The split-KV decode kernel's choices (`tapa.ops.tapa.decode_kernel`): its logits' trig and
    far series (as `KernelConfigs`; no bands, no split distances), the (BLOCK_N, warps) tiles its
    autotuner picks from on a GPU, their pipeline stages, and the split length's alignment on a
    GPU (a multiple of every BLOCK_N)."""

    trig_poly: bool
    taylor_order: int
    taylor_tolerance: float
    tiles: tuple[tuple[int, int], ...]
    num_stages: int
    split_align: int


# Three tiles of the six (32, 64, 128 keys x 4, 8 warps) the autotuner once chose from: 64x4 and
# 128x4 were each within 1.03x of the tuned pick in every bucket `tapa bench decode` tuned on an
# H100 (bf16, head dim 128; 2026-12-07), and the 8-warp tiles never won by more than 2%. 32x4 stays
# for the widest tiles: compiled for an A100 (sm_80) at head dim 256 in float32, a 64-key tile
# asks 168,000 bytes of shared memory, over the 163 KB a block may have, and 32 keys 100,416
# (tests/ops/test_compile.py). Each tile tried costs the first call of a new bucket its timing
# (about 0.1 s) and, in a new process, its compile.
DECODE = DecodeConfigs(trig_poly=True, taylor_order=6, taylor_tolerance=1e-8,
                       tiles=((32, 4), (64, 4), (128, 4)), num_stages=2, split_align=128)
