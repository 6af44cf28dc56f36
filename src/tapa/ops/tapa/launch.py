"""Host side of the fused TAPA kernels: block-size choice, constants, grids and launches.

`forward` returns (out, lse); `backward` returns (dq, dk, dv). Autograd and the torch custom op
around them live in `tapa.ops.tapa.fused`; the kernels in `tapa.ops.tapa.kernels`.

Kernel variants (for timing them against the defaults, never defaults before they are timed):
`LaunchConfigs` holds every choice, `parse_variant` reads one from a string such as
"dkdv=64x128/8/2,dq_atomic=1,trig_terms=4" (keys are the field names), and the environment
variable TAPA_KERNEL_VARIANT applies such a string on top of `default_configs`, so that any
command (`tapa bench model`, training) runs a variant unchanged.

The forward's tile may depend on the key length: `LaunchConfigs.fwd` up to FWD_SHORT_KEYS keys
and `fwd_long` above, where a config sets it (`forward_config`). Each forward row writes its own
lse, so the backward, whatever its tiles, reads the same lse from either forward tile.
"""

import functools
import math
import os
from dataclasses import dataclass, fields, replace

import torch
import triton
from triton.tools.tensor_descriptor import TensorDescriptor

from tapa.ops.tapa import kernels as kernels
from tapa.ops.tapa.logits import TRIG_COEFFICIENTS

MAX_HEAD_DIM = 256
# Error target of the Taylor series of d ** alpha around a tile's centre distance (relative),
# and its degree (1..6; a lower degree narrows the band of tiles where the series applies).
TAYLOR_TOLERANCE = 1e-8
TAYLOR_ORDER = 6
# cos/sin as polynomials on the FMA pipes (True) or the MUFU's cos.approx/sin.approx (False), where
# a config does not choose. The 16-bit configs at D <= 128 choose the MUFU (faster, and within the
# accuracy bar on the H200: results/kernel-h200/probe-2026-12-01, run-9.md); float32 keeps the
# polynomials.
TRIG_POLY = True
# Terms of the sin polynomial (cos takes one more); see triton_logits.TRIG_COEFFICIENTS.
TRIG_TERMS = 6
# float32 inputs never take a polynomial whose evaluation error exceeds this.
FLOAT32_TRIG_ERROR = 1e-6
VARIANT_ENV = "TAPA_KERNEL_VARIANT"
# From this f(d) on, the kernels take the LONG_PHASE path: d ** alpha to a few ulp however large,
# and a second turn reduction, valid for any finite phase. Below it the one reduction (exact for
# |t| < 2**22) needs only |q_P . k_P| / sqrt(d_P) < 2**19, and exp2(alpha * log2 d) loses at most
# ln(8) ~ 2 ulp. The default alpha = 0.1 stays below it up to 2**24 tokens (f = 5.3).
LONG_PHASE_FROM = 8.0
# dQ by float32 atomics from the dK/dV kernel (True) or by a separate dQ kernel (False), where a
# config does not choose. The 16-bit configs at D <= 128 choose it (see `_default_configs`).
DQ_ATOMIC = False
# With dQ by atomics: compute each tile's dQ share transposed, dQ^T = K^T dS (True), so that its
# dots run on wgmma at query tiles below 64, where a config does not choose. The 16-bit configs at
# D = 128 choose it (timed in results/kernel-h200/run-5.md).
DQ_TRANSPOSE = False
# The dK/dV kernel's unmasked query blocks from the last one down (True) instead of up from its
# diagonal, so that the key blocks' programs running at once read the same query rows together
# (an L2 question), where a config does not choose. No default sets it: Run 7 timed it 1.4-5.5%
# slower at 4k-64k, and ncu showed the L2 hit rate at 90-99% without it (results/kernel-h200/run-7.md).
DKDV_REVERSE = False
# The forward takes each tile's distances s as one float offset per row less a float column ramp
# made once, not from an integer column index converted per tile (the same values, exactly: every
# term is an integer below 2**24), and a far tile's u = s / d0 - 1 as one multiply-add per score
# from the two. Offline (Triton 3.6, sm_90): offline-census-6.md, "After". The 16-bit configs at
# D <= 128 choose it, with the next two (timed in results/kernel-h200/run-9.md).
FWD_SPLIT_S = False
# The forward's far tiles take log2(d0) and 1 / d0 (per tile) from the MUFU's approximations, not
# libdevice's log2f and an IEEE division (the near tiles' per-score log2 is the MUFU's already).
FWD_FAST_SCALARS = False
# The forward's far tiles evaluate the d**alpha series in the column term: with u = a_i + b_j (a per
# row, b per column, from the split distances), the series is a polynomial in b_j with per-row
# coefficients, one multiply-add per score less than Horner in u (`triton_logits._column_series`).
# Implies the split distances; taylor_order 1..3. Run 13 priced one FMA per score at 3.9% of the
# D=64 forward (results/kernel-h200/run-13.md). The 16-bit configs choose it with the order-2 series
# (results/kernel-h200/run-14.md).
FWD_ROW_SERIES = False
# With FWD_ROW_SERIES: the series on the loop-invariant column ramp, the tile's -1 / d0 folded into
# the coefficients, so that no per-tile column vector is built (16 multiplies a 64x64 tile a
# thread, 0.5 a score: offline-census-9.md). Implies FWD_ROW_SERIES; not yet timed.
FWD_RAMP_SERIES = False
# The forward's softmax row sums as a product of the bf16/fp16 probabilities (the ones the PV product
# takes) with a ones tile on the tensor cores, not as per-thread adds and shuffles: 0.91 fewer
# instructions a far score at D=64 offline (offline-census-9.md), 8 B more stack. Not yet timed.
FWD_DOT_ROWSUM = False
# The forward's MUFU cos takes the phase in radians, unreduced (2 pi folded into phase_scale): the
# MUFU reduces its argument itself, so the turn reduction and the scaling back by 2 pi go (3 of the
# 6 instructions the phase takes after fs per score, offline-census-6.md). Only with the MUFU trig
# and without LONG_PHASE; its accuracy for large phases is the MUFU's, checked on the GPU only
# (the CUDA tests of tests/ops/test_triton_attention.py, run-9.md).
FWD_COS_RADIANS = False
# The forward loads its K and V tiles by TMA descriptors (Hopper's tensor memory accelerator):
# one thread issues each tile's copy and the warps wait on a barrier, in place of every thread's
# addresses and cp.async (2.06 of the D=64 far tile's 17.94 instructions a score,
# offline-census-9.md). Only on sm_90+ (or under the interpreter) and where the tensors allow it
# (`tma_ok`); elsewhere the pointer loads. The 16-bit configs at D = 128 choose it (fwd x0.95-0.97
# at 4k-64k); at D = 64 it loses 1-3%: its far tile takes 16 instructions more (R2UR of the four
# coordinates, the elected issue, the barrier waits: results/kernel-h200/run-24.md).
FWD_TMA = False
# The forward rescales its accumulators only when some row's max passes the one they are kept at by
# more than RESCALE_SLACK (2 ** 8; a block-wide test a tile), instead of at every tile: the 64 x Dv
# accumulator's multiplies (1 a score at D=64, 2 at D=128: offline-census-9.md), the rescale's
# exp2 and the -inf guard go from most tiles. Not chosen: fwd x1.04-1.05 at D=64 and up to x1.11
# at D=128 (Run 24): Triton's block-wide test is five shuffles and two barriers a tile, more than
# the multiplies it saves (results/kernel-h200/run-24.md).
FWD_LAZY_RESCALE = False
# The forward as a persistent kernel: a one-dimensional grid of about as many programs as fit on
# the GPU at once (`persistent_programs`), each looping over (query block, batch-head) tiles,
# batch-head major, the longest rows first where causal, instead of one program per tile. Run 28
# timed it query-block major: fwd x1.12-1.20 at D=64 and x1.16-1.41 at D=128; Run 29 the
# batch-head-major order: x1.12-1.29 and x1.07-1.39, so the tile order's L2 use was not the cause.
# Offline (Triton 3.6) the outer loop spills where the default does not: D=64 stack 56 -> 160 B
# (LDL/STL 19/14 -> 36/33), D=128's 64x64 tile 0 -> 24 B at 255 registers; D=128's 128x64 tile,
# which does not spill, still loses 7% at 64k (results/kernel-h200/run-29.md). Not chosen.
FWD_PERSISTENT = False
# The forward's distance series in three bands of tiles instead of one: order TAYLOR_ORDER - 1 on
# the farthest tiles (where it holds at the same tolerance), TAYLOR_ORDER + 1 between the band of
# TAYLOR_ORDER and the diagonal, so that fewer tiles take the exact near-diagonal form. Offline
# (Triton 3.6, D=64, order 2 at 1e-5, `scripts/fwd_loop_census.py --paths`): a far tile 574 ->
# 538 instructions in the order-1 band, 576 in the order-2 one, a tile between it and the
# diagonal 666 -> 616; about x0.98 of the unmasked loop's instructions at 1k-4k, x0.97 at 16k,
# x0.95 at 64k. The backward kernels' arms differ less (their near tiles cost 4-9% more than far
# ones), so they keep one band. Timed in Run 29: fwd x0.953-0.967 at D=64 (1k-64k), the 16-bit
# D=64 default since; x0.980-1.003 at D=128, not chosen there (no gain at 1k or 64k). Every bf16
# error and the 64k far rows as without (results/kernel-h200/run-29.md).
FAR_BANDS = False
# The same three bands in both backward kernels (their tiles' d**alpha), with the radii FAR_BANDS
# would take; the dQ kernel's column-term series then takes orders up to 2. Not chosen, from the
# offline census alone (Triton 3.6, D=64 default, `scripts/fwd_loop_census.py --kernel dkdv|dq
# --variant bwd_bands=1 --paths`, results/kernel-h200/offline-census-12.md): the branches cost
# every path 4-16 instructions, so the dK/dV kernel's unmasked tile goes 606 -> 601 at order 1
# and 617 at order 2, its near tile 627 -> 639 (635 at order 3); the dQ kernel's 394 -> 383 and
# 399, near 429 -> 433 (422 at order 3): at most about 1% of the backward at 64k, a loss at 4k.
BWD_BANDS = False
# The backward kernels' loop tiles by TMA descriptors, as FWD_TMA: the dK/dV kernel's Q and dO
# tiles, the dQ kernel's K and V tiles. Not chosen: bwd x1.01-1.03 at D=64 (dQ kernel 394 -> 442
# instructions a far tile offline), and at D=128 the dK/dV kernel spills (bwd x1.48-1.53, Run 24).
DKDV_TMA = False
DQ_TMA = False
# The same in the dK/dV kernel: its MUFU cos and sin on the unreduced phase (phase_scale and the
# phase gradient's scale adjusted for the 2 pi). The 16-bit configs at D = 128 choose it (bwd
# x0.986-0.989 of the kernel without it at 4k-64k, in two runs: run-9.md).
DKDV_COS_RADIANS = False
# The same in the dQ kernel (its own phase_scale and phase gradient scale adjusted). Offline (Triton
# 3.6, D=64): the turn reduction (3 instructions a score) and the scaling back by 2 pi (1) go, the
# MUFU's own scaling by 1 / 2 pi stays (results/kernel-h200/offline-census-10.md). The 16-bit
# configs at D = 64 choose it with DKDV_COS_RADIANS (results/kernel-h200/run-17.md).
DQ_COS_RADIANS = False
# The backward kernels' far tiles take log2(d0) and 1 / d0 from the MUFU's approximations, as the
# forward's FWD_FAST_SCALARS: libdevice's log2f and the IEEE division are about 45 instructions a
# tile, 2.8 a score of the D=64 dQ kernel's 16 a thread (offline-census-10.md). The 16-bit configs
# at D = 64 choose it with DQ_SPLIT_S (results/kernel-h200/run-18.md); at D = 128 it missed the
# adoption rule at 4k (bwd x0.997, run-18.md).
BWD_FAST_SCALARS = False
# The dQ kernel takes its distances as the forward's FWD_SPLIT_S does, and with DQ_ROW_SERIES (which
# implies it) its far tiles' series in the column term, as FWD_ROW_SERIES (taylor_order 1..3). The
# 16-bit configs at D = 64 choose DQ_SPLIT_S; DQ_ROW_SERIES timed no faster on top (run-18.md).
DQ_SPLIT_S = False
DQ_ROW_SERIES = False
# The dK/dV kernel's distances split the same way (its tiles are keys x queries: the row offset is
# the query block's first position less each key's, the column term the negated query ramp).
# Not chosen: bwd x1.005-1.016 at D=64 on top of the radians kernels, and a loss at D=128 too, with
# 8-32 B more stack (run-17.md, offline-census-10.md).
DKDV_SPLIT_S = False
# Up to this many keys the forward takes `LaunchConfigs.fwd`, above it `fwd_long` where set.
FWD_SHORT_KEYS = 16384


@dataclass(frozen=True)
class KernelConfig:
    """Block sizes and launch options of one kernel: queries x keys per tile, warps, stages,
    whether its main loop asks Triton for warp specialization (`tl.range(warp_specialize=)`), and
    a register cap per thread (Triton's `maxnreg`; None: ptxas chooses), which trades spills for
    more blocks per SM."""

    block_m: int
    block_n: int
    num_warps: int = 4
    num_stages: int = 2
    warp_specialize: bool = False
    max_registers: int | None = None

    def __str__(self):
        return (f"{self.block_m}x{self.block_n}/{self.num_warps}/{self.num_stages}"
                + (f"/r{self.max_registers}" if self.max_registers else "")
                + ("/ws" if self.warp_specialize else ""))

    def launch_options(self) -> dict:
        """The launch's compile options: warps, stages and, where set, the register cap."""
        options = dict(num_warps=self.num_warps, num_stages=self.num_stages)
        if self.max_registers:
            options["maxnreg"] = self.max_registers
        return options


@dataclass(frozen=True)
class LaunchConfigs:
    fwd: KernelConfig
    dkdv: KernelConfig
    dq: KernelConfig
    trig_poly: bool | None = None  # None: the module's TRIG_POLY
    dq_atomic: bool | None = None  # None: the module's DQ_ATOMIC
    trig_terms: int | None = None  # None: the module's TRIG_TERMS
    taylor_order: int | None = None  # None: the module's TAYLOR_ORDER
    taylor_tolerance: float | None = None  # None: the module's TAYLOR_TOLERANCE
    dq_transpose: bool | None = None  # None: the module's DQ_TRANSPOSE (read only with dq_atomic)
    fwd_long: KernelConfig | None = None  # the forward above FWD_SHORT_KEYS keys; None: fwd at every length
    dkdv_reverse: bool | None = None  # None: the module's DKDV_REVERSE
    fwd_split_s: bool | None = None  # None: the module's FWD_SPLIT_S
    fwd_fast_scalars: bool | None = None  # None: the module's FWD_FAST_SCALARS
    fwd_row_series: bool | None = None  # None: the module's FWD_ROW_SERIES
    fwd_ramp_series: bool | None = None  # None: the module's FWD_RAMP_SERIES
    fwd_dot_rowsum: bool | None = None  # None: the module's FWD_DOT_ROWSUM
    fwd_cos_radians: bool | None = None  # None: the module's FWD_COS_RADIANS
    fwd_tma: bool | None = None  # None: the module's FWD_TMA
    fwd_lazy_rescale: bool | None = None  # None: the module's FWD_LAZY_RESCALE
    fwd_persistent: bool | None = None  # None: the module's FWD_PERSISTENT
    far_bands: bool | None = None  # None: the module's FAR_BANDS
    bwd_bands: bool | None = None  # None: the module's BWD_BANDS
    dkdv_cos_radians: bool | None = None  # None: the module's DKDV_COS_RADIANS
    dq_cos_radians: bool | None = None  # None: the module's DQ_COS_RADIANS
    bwd_fast_scalars: bool | None = None  # None: the module's BWD_FAST_SCALARS
    dq_split_s: bool | None = None  # None: the module's DQ_SPLIT_S
    dq_row_series: bool | None = None  # None: the module's DQ_ROW_SERIES
    dkdv_split_s: bool | None = None  # None: the module's DKDV_SPLIT_S
    dkdv_tma: bool | None = None  # None: the module's DKDV_TMA
    dq_tma: bool | None = None  # None: the module's DQ_TMA


# Fixed when the kernels are defined (TRITON_INTERPRET is read then); a module constant, so that
# torch.compile traces `interpreting()` (dynamo cannot take the type of a Triton kernel object).
_INTERPRETING = type(kernels._fwd_kernel).__name__ == "InterpretedFunction"


def interpreting() -> bool:
    """True when the kernels run under Triton's CPU interpreter (TRITON_INTERPRET=1)."""
    return _INTERPRETING


# Set by `override_configs` (benchmark sweeps) to replace the choice below.
_override: LaunchConfigs | None = None


class override_configs:
    """Context manager: launch every kernel with these configs (for benchmark sweeps)."""

    def __init__(self, configs: LaunchConfigs):
        self.configs = configs

    def __enter__(self):
        global _override
        self.previous, _override = _override, self.configs

    def __exit__(self, *exc):
        global _override
        _override = self.previous


def _parse_kernel_config(key: str, text: str) -> KernelConfig:
    """'128x64/8/3' (warps and stages optional, then '/rN' for a cap of N registers per thread,
    '/ws' last for warp specialization)."""
    parts = text.split("/")
    warp_specialize = parts[-1] == "ws"
    if warp_specialize:
        parts = parts[:-1]
    max_registers = None
    if len(parts) > 1 and parts[-1].startswith("r"):
        cap = parts.pop()[1:]
        if not cap.isdigit() or not 24 <= int(cap) <= 248 or int(cap) % 8:
            raise ValueError(f"kernel variant {key}={text!r}: a register cap is r24 .. r248 in steps "
                             "of 8, e.g. r168")
        max_registers = int(cap)
    try:
        block_m, block_n = (int(x) for x in parts[0].split("x"))
        numbers = [int(x) for x in parts[1:]]
    except ValueError:
        numbers = None
    if numbers is None or len(numbers) > 2:
        raise ValueError(f"kernel variant {key}={text!r}: expected BMxBN[/warps[/stages]][/rN][/ws], "
                         "e.g. 128x64/8/3")
    config = KernelConfig(block_m, block_n, *numbers, warp_specialize=warp_specialize,
                          max_registers=max_registers)
    for name in ("block_m", "block_n", "num_warps"):
        value = getattr(config, name)
        if value < 1 or value & (value - 1):
            raise ValueError(f"kernel variant {key}={text!r}: {name} must be a power of two")
    if config.block_m < 16 or config.block_n < 16 or config.num_stages < 1:
        raise ValueError(f"kernel variant {key}={text!r}: blocks must be >= 16 and stages >= 1")
    return config


def _parse_flag(key: str, text: str) -> bool:
    if text not in ("0", "1"):
        raise ValueError(f"kernel variant {key}={text!r}: expected 0 or 1")
    return text == "1"


def parse_variant(spec: str) -> dict:
    """Field changes of `LaunchConfigs` from 'key=value,key=value' (keys are its field names).

    fwd/fwd_long/dkdv/dq=BMxBN[/warps[/stages]][/ws]; dq_atomic, dq_transpose, dkdv_reverse,
    fwd_split_s, fwd_fast_scalars, fwd_row_series, fwd_ramp_series, fwd_dot_rowsum,
    fwd_cos_radians, fwd_tma, fwd_lazy_rescale, fwd_persistent, dkdv_cos_radians, dq_cos_radians,
    bwd_fast_scalars, dq_split_s, dq_row_series, dkdv_split_s, dkdv_tma, dq_tma, far_bands,
    bwd_bands, trig_poly=0|1;
    trig_terms=3..6 (sin terms; float32 inputs keep at least FLOAT32_TRIG_ERROR);
    taylor_order=1..6; taylor_tolerance=<float>. An empty spec changes nothing.
    """
    changes: dict = {}
    names = {f.name for f in fields(LaunchConfigs)}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        key, sep, text = item.partition("=")
        key, text = key.strip(), text.strip()
        if not sep or key not in names:
            raise ValueError(f"kernel variant {item!r}: expected key=value with key one of "
                             f"{sorted(names)}")
        if key in ("fwd", "fwd_long", "dkdv", "dq"):
            changes[key] = _parse_kernel_config(key, text)
        elif key in ("dq_atomic", "dq_transpose", "dkdv_reverse", "fwd_split_s", "fwd_fast_scalars",
                     "fwd_row_series", "fwd_ramp_series", "fwd_dot_rowsum", "fwd_cos_radians",
                     "fwd_tma", "fwd_lazy_rescale", "fwd_persistent", "dkdv_cos_radians",
                     "dq_cos_radians", "bwd_fast_scalars", "dq_split_s", "dq_row_series",
                     "dkdv_split_s", "dkdv_tma", "dq_tma", "far_bands", "bwd_bands", "trig_poly"):
            changes[key] = _parse_flag(key, text)
        elif key == "trig_terms":
            if not text.isdigit() or int(text) not in TRIG_COEFFICIENTS:
                raise ValueError(f"kernel variant trig_terms={text!r}: expected one of "
                                 f"{sorted(TRIG_COEFFICIENTS)}")
            changes[key] = int(text)
        elif key == "taylor_order":
            if not text.isdigit() or not 1 <= int(text) <= 6:
                raise ValueError(f"kernel variant taylor_order={text!r}: expected 1..6")
            changes[key] = int(text)
        else:
            try:
                tolerance = float(text)
            except ValueError:
                tolerance = -1.0
            if not 0 < tolerance < 1e-2:
                raise ValueError(f"kernel variant taylor_tolerance={text!r}: expected 0 < x < 1e-2")
            changes[key] = tolerance
    return changes


def with_variant(configs: LaunchConfigs, changes: dict | str) -> LaunchConfigs:
    """configs with the changes of `parse_variant` (or its spec string) applied. A `fwd` change
    without a `fwd_long` one sets the forward's tile at every key length (it clears `fwd_long`)."""
    changes = parse_variant(changes) if isinstance(changes, str) else changes
    if "fwd" in changes and "fwd_long" not in changes:
        changes = {**changes, "fwd_long": None}
    return replace(configs, **changes)


def variant_text(changes: dict) -> str:
    """The spec `parse_variant` reads back into these changes."""
    return ",".join(f"{key}={int(value) if isinstance(value, bool) else value}"
                    for key, value in changes.items())


def describe(configs: LaunchConfigs) -> str:
    """The variant string that rebuilds configs with `with_variant` from any base."""
    return variant_text({f.name: getattr(configs, f.name) for f in fields(configs)
                         if getattr(configs, f.name) is not None})


@functools.lru_cache(maxsize=8)
def _env_variant(spec: str) -> dict:
    try:
        return parse_variant(spec)
    except ValueError as err:
        raise ValueError(f"{VARIANT_ENV}: {err}") from None


def default_configs(head_dim: int, v_dim: int, dtype: torch.dtype) -> LaunchConfigs:
    """Block sizes by head size and dtype (Hopper choices; see results/kernel-h200/NOTES.md),
    with the variant of TAPA_KERNEL_VARIANT applied when it is set (not under `override_configs`)."""
    if _override is not None:
        return _override
    configs = _default_configs(head_dim, v_dim, dtype)
    spec = os.environ.get(VARIANT_ENV, "")
    return with_variant(configs, _env_variant(spec)) if spec else configs


def _default_configs(head_dim: int, v_dim: int, dtype: torch.dtype) -> LaunchConfigs:
    if interpreting():  # small tiles: several per test shape, and quick on a CPU
        return LaunchConfigs(KernelConfig(32, 16), KernelConfig(16, 32), KernelConfig(32, 16))
    width = max(head_dim, v_dim)
    if dtype == torch.float32:  # float32 operands take twice the registers and shared memory
        width *= 2
    if width <= 128:  # the best measured blocks at D=128 (NOTES.md); 16-bit D=64 its own, below
        configs = LaunchConfigs(KernelConfig(128, 64, 8, 3), KernelConfig(32, 128, 8, 2),
                                KernelConfig(128, 16, 8, 2))
        if dtype in (torch.bfloat16, torch.float16):
            # The H200 probe's winners, each group's best accurate variant combined and timed against
            # this default in the same run (results/kernel-h200/probe-2026-12-01): fwd+bwd x0.69-0.72
            # at D=128 (dQ by atomics, MUFU cos/sin, a degree-3 d ** alpha series on far tiles), and
            # x0.85-0.88 at D=64 (a 128x64 dQ kernel, the 3-term sin polynomial, the same series).
            # Their bf16 errors equal the default's; float32 keeps the longer series and polynomials.
            # At D=128 the atomic dQ's products run transposed (dQ^T = K^T dS^T): bwd x0.91-0.93 of
            # the untransposed kernel, the same bf16 errors (results/kernel-h200/run-5.md).
            # Up to FWD_SHORT_KEYS keys the forward takes 4-warp 64x64 tiles (two blocks per SM):
            # fwd x0.84-0.90 at N <= 4096, x0.96-0.99 at 16k, x0.99-1.01 at 64k (run-5.md, causal).
            # Both changes together: fwd+bwd x0.91-0.93 of the Run-4 default at 1k-64k, causal, and
            # x0.84-0.88 non-causal (run-6.md).
            # The forward's distances as row offsets less a column ramp, a far tile's scalars from
            # the MUFU, and its MUFU cos on the unreduced phase in radians (offline-census-6.md):
            # fwd x0.90-0.94 of the kernel without them at 4k-64k, D=128; at D=64, with the MUFU
            # trig in place of the 3-term polynomial, fwd x0.92-0.95 and bwd x0.94-0.96
            # (results/kernel-h200/run-9.md). Their bf16 errors equal the default's.
            # The far tiles' series at order 2 and tolerance 1e-5, in the forward as a polynomial in
            # the column term (FWD_ROW_SERIES): two multiply-adds a score fewer than order 3 in u;
            # fwd x0.93-0.97 at D=64 and x0.96-0.99 at D=128 of order 3 at 1e-6 at 4k-64k (a tie at
            # D=128 1k, where no tile is far), the backward's time and every bf16 error (the 64k far
            # rows included) unchanged (results/kernel-h200/run-14.md, run-15.md).
            far_series = dict(taylor_order=2, taylor_tolerance=1e-5, fwd_row_series=True)
            short_forward = dict(fwd=KernelConfig(64, 64, 4, 2), fwd_long=configs.fwd)
            lean_forward = dict(trig_poly=False, fwd_split_s=True, fwd_fast_scalars=True,
                                fwd_cos_radians=True)
            if width <= 64:
                # D=64 under a 168-register cap (three blocks per SM, offline-census-7.md): the 4-warp
                # 64x64 forward at every length, fwd x0.86-0.93 of the short/long pair, and a 32x64
                # dK/dV, bwd x0.85-0.90 of the 32x128 one, at 4k-64k (results/kernel-h200/run-10.md,
                # run-11.md). The dQ kernel at 64x32/4/2: bwd x0.92-0.95 of 128x64/8/2 (run-12.md).
                # Both backward kernels' MUFU sin/cos on the unreduced phase: bwd x0.955-0.972 at
                # 4k-64k, every bf16 error and the 64k far rows unchanged (run-17.md). On top, both
                # backward kernels' far-tile scalars from the MUFU and the dQ kernel's split
                # distances: bwd x0.970-0.980 at 4k-64k, the errors unchanged (run-18.md). The
                # forward's series in three bands (FAR_BANDS): fwd x0.953-0.967 at 1k-64k (run-29.md).
                capped = dict(fwd=KernelConfig(64, 64, 4, 2, max_registers=168), fwd_long=None,
                              dkdv=KernelConfig(32, 64, 4, 2, max_registers=168))
                return replace(configs, dq=KernelConfig(64, 32, 4, 2), dkdv_cos_radians=True,
                               dq_cos_radians=True, bwd_fast_scalars=True, dq_split_s=True,
                               far_bands=True, **far_series, **lean_forward, **capped)
            # At D=128 the forward's K/V tiles by TMA: fwd x0.954 / 0.960 / 0.974 at 4k / 16k / 64k,
            # every bf16 error and the 64k far rows unchanged; at D=64 it loses 1-3%, as do the
            # backward kernels' TMA tiles (results/kernel-h200/run-24.md).
            return replace(configs, dq_atomic=True, dq_transpose=True, dkdv_cos_radians=True,
                           fwd_tma=True, **far_series, **short_forward, **lean_forward)
        return configs
    if width <= 256:
        return LaunchConfigs(KernelConfig(64, 64, 4, 2), KernelConfig(16, 64, 4, 2),
                             KernelConfig(64, 16, 4, 2))
    return LaunchConfigs(KernelConfig(32, 32, 4, 1), KernelConfig(16, 32, 4, 1),
                         KernelConfig(32, 16, 4, 1))


def _chosen(configs: LaunchConfigs | None, name: str, default):
    value = None if configs is None else getattr(configs, name)
    return default if value is None else value


def forward_config(configs: LaunchConfigs, n_k: int) -> KernelConfig:
    """The forward's tile for n_k keys: `fwd_long` above FWD_SHORT_KEYS where configs set it."""
    return configs.fwd_long if configs.fwd_long is not None and n_k > FWD_SHORT_KEYS else configs.fwd


def dq_by_atomics(configs: LaunchConfigs | None = None) -> bool:
    """dQ by float32 atomics from the dK/dV kernel, whose summation order changes from run to run,
    unless torch's deterministic mode is on (`torch.use_deterministic_algorithms`): then the
    separate dQ kernel, bitwise reproducible."""
    return bool(_chosen(configs, "dq_atomic", DQ_ATOMIC)) and not torch.are_deterministic_algorithms_enabled()


def dkdv_flags(configs: LaunchConfigs | None = None, logit_flags: dict | None = None) -> dict:
    """The dK/dV kernel's own constexprs: dQ by atomics (`dq_by_atomics`) and, with them, the
    transposed dQ products; the query blocks' order; `DKDV_COS_RADIANS` (with the call's
    `logits_args` flags, as `fwd_flags`), `BWD_FAST_SCALARS`, `DKDV_SPLIT_S`, `DKDV_TMA` (asked
    for: `backward` takes it only where `tma_ok`) and `BWD_BANDS`."""
    dq_atomic = dq_by_atomics(configs)
    return dict(DQ_ATOMIC=dq_atomic,
                DQ_TRANSPOSE=dq_atomic and bool(_chosen(configs, "dq_transpose", DQ_TRANSPOSE)),
                REVERSE_Q=bool(_chosen(configs, "dkdv_reverse", DKDV_REVERSE)),
                COS_RADIANS=_cos_radians(configs, "dkdv_cos_radians", DKDV_COS_RADIANS, logit_flags),
                FAST_SCALARS=bool(_chosen(configs, "bwd_fast_scalars", BWD_FAST_SCALARS)),
                SPLIT_S=int(bool(_chosen(configs, "dkdv_split_s", DKDV_SPLIT_S))),
                TMA=bool(_chosen(configs, "dkdv_tma", DKDV_TMA)),
                BANDS=bool(_chosen(configs, "bwd_bands", BWD_BANDS)))


def dq_flags(configs: LaunchConfigs | None = None, logit_flags: dict | None = None) -> dict:
    """The dQ kernel's own constexprs: its distances (`DQ_SPLIT_S`, SPLIT_S 2 with
    `DQ_ROW_SERIES`), `BWD_FAST_SCALARS`, `DQ_COS_RADIANS` (with the call's `logits_args` flags,
    as `fwd_flags`), `DQ_TMA` (as `dkdv_flags`' TMA) and `BWD_BANDS`."""
    bands = bool(_chosen(configs, "bwd_bands", BWD_BANDS))
    split_s = _split_s(configs, ("dq_split_s", DQ_SPLIT_S), ("dq_row_series", DQ_ROW_SERIES),
                       bands="bwd_bands" if bands else None)
    return dict(SPLIT_S=split_s, BANDS=bands,
                FAST_SCALARS=bool(_chosen(configs, "bwd_fast_scalars", BWD_FAST_SCALARS)),
                COS_RADIANS=_cos_radians(configs, "dq_cos_radians", DQ_COS_RADIANS, logit_flags),
                TMA=bool(_chosen(configs, "dq_tma", DQ_TMA)))


def _split_s(configs: LaunchConfigs | None, split: tuple, row: tuple, ramp: tuple | None = None,
             bands: str | None = None) -> int:
    """A kernel's SPLIT_S from its (name, module default) flags: 1 for the split distances, 2 for
    the column-term series (which implies them), 3 for that series on the ramp (implies both);
    the column-term forms take taylor_order 1..3 only (1..2 where the kernel's bands flag, named
    by `bands`, is on: their outer series is one order more)."""
    with_ramp = ramp is not None and bool(_chosen(configs, *ramp))
    if not (with_ramp or _chosen(configs, *row)):
        return int(bool(_chosen(configs, *split)))
    order = _chosen(configs, "taylor_order", TAYLOR_ORDER)
    top = 2 if bands else 3  # the bands' outer series is one order more
    if not 1 <= order <= top:
        if bands:
            raise ValueError(f"{row[0]} takes taylor_order 1..2 with {bands}, got {order} (add "
                             f"{bands}=0 for order 3, or {row[0]}=0 for any order; the 16-bit D=64 "
                             "defaults set far_bands and fwd_row_series)")
        raise ValueError(f"{row[0]} takes taylor_order 1..3, got {order} (the 16-bit defaults set "
                         "fwd_row_series=1: add fwd_row_series=0 for a higher order)")
    return 3 if with_ramp else 2


def fwd_flags(configs: LaunchConfigs | None = None, logit_flags: dict | None = None) -> dict:
    """The forward kernel's own constexprs: how it takes the distances s (`FWD_SPLIT_S`; SPLIT_S
    is 2 with `FWD_ROW_SERIES`, which implies it, and 3 with `FWD_RAMP_SERIES`, which implies
    both), a far tile's scalars (`FWD_FAST_SCALARS`), the softmax row sums (`FWD_DOT_ROWSUM`) and
    the cos's argument (`FWD_COS_RADIANS`, only where the call's `logits_args` flags take the MUFU
    trig without LONG_PHASE; none given: never), the K/V loads by TMA (`FWD_TMA`, asked for:
    `forward` takes them only where `tma_ok`), the lazy rescale (`FWD_LAZY_RESCALE`), the
    persistent grid (`FWD_PERSISTENT`) and the series bands (`FAR_BANDS`, whose radii
    `logits_args` sets)."""
    bands = bool(_chosen(configs, "far_bands", FAR_BANDS))
    split_s = _split_s(configs, ("fwd_split_s", FWD_SPLIT_S), ("fwd_row_series", FWD_ROW_SERIES),
                       ("fwd_ramp_series", FWD_RAMP_SERIES), "far_bands" if bands else None)
    return dict(SPLIT_S=split_s,
                FAST_SCALARS=bool(_chosen(configs, "fwd_fast_scalars", FWD_FAST_SCALARS)),
                DOT_ROWSUM=bool(_chosen(configs, "fwd_dot_rowsum", FWD_DOT_ROWSUM)),
                TMA=bool(_chosen(configs, "fwd_tma", FWD_TMA)),
                LAZY_RESCALE=bool(_chosen(configs, "fwd_lazy_rescale", FWD_LAZY_RESCALE)),
                PERSISTENT=bool(_chosen(configs, "fwd_persistent", FWD_PERSISTENT)),
                BANDS=bands,
                COS_RADIANS=_cos_radians(configs, "fwd_cos_radians", FWD_COS_RADIANS, logit_flags))


def _cos_radians(configs: LaunchConfigs | None, name: str, default: bool, logit_flags: dict | None) -> bool:
    """A kernel's COS_RADIANS: asked for, and the call's logits take the MUFU trig without
    LONG_PHASE (no flags given: never)."""
    return (bool(_chosen(configs, name, default)) and logit_flags is not None
            and not logit_flags["TRIG_POLY"] and not logit_flags["LONG_PHASE"])


def with_radians(scalars: list, grad_scales: list | None = None) -> tuple[list, list | None]:
    """A COS_RADIANS kernel's scalars: phase_scale (scalars[1], after the logit scale) carries 2 pi,
    and the phase gradient's scale (grad_scales[1]) gives it back."""
    scalars = [scalars[0], scalars[1] * 2 * math.pi, *scalars[2:]]
    return scalars, None if grad_scales is None else [grad_scales[0], grad_scales[1] / (2 * math.pi)]


# every name `_remember` records a training kernel under (`compiled_kernels`, the census)
TRAINING_KERNELS = frozenset({"fwd", "dkdv", "dkdv_atomic_dq", "dkdv_atomic_dq_t", "dq"})


def dkdv_kernel_name(flags: dict) -> str:
    """The dK/dV kernel's name in `compiled_kernels` and the census, by its `dkdv_flags`."""
    if not flags["DQ_ATOMIC"]:
        return "dkdv"
    return "dkdv_atomic_dq_t" if flags["DQ_TRANSPOSE"] else "dkdv_atomic_dq"


def trig_poly(configs: LaunchConfigs | None = None) -> bool:
    """Polynomial cos/sin or the MUFU's; the interpreter has no PTX, so it always takes the polynomials."""
    return _chosen(configs, "trig_poly", TRIG_POLY) or interpreting()


def trig_terms(configs: LaunchConfigs | None, dtype: torch.dtype) -> int:
    """Terms of the sin polynomial; float32 inputs take the next longer one until its error is
    at most FLOAT32_TRIG_ERROR (the half-precision grades would show in float32 results)."""
    terms = _chosen(configs, "trig_terms", TRIG_TERMS)
    if dtype == torch.float32:
        while TRIG_COEFFICIENTS[terms][2] > FLOAT32_TRIG_ERROR:
            terms += 1
    return terms


def check_supported(q: torch.Tensor, v: torch.Tensor) -> None:
    """Raise ValueError for inputs the kernels do not handle (the reference handles them)."""
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"the fused TAPA kernel takes float16, bfloat16 or float32, got {q.dtype}")
    if q.shape[-1] > MAX_HEAD_DIM or v.shape[-1] > MAX_HEAD_DIM:
        raise ValueError(f"the fused TAPA kernel takes head_dim <= {MAX_HEAD_DIM}, got "
                         f"q/k {q.shape[-1]}, v {v.shape[-1]}; use impl='reference'")


def _binomial(alpha: float, order: int) -> float:
    value = 1.0
    for i in range(order):
        value *= (alpha - i) / (i + 1)
    return value


def taylor_series_error(alpha: float, order: int, rho: float, points: int = 257) -> float:
    """Largest |1 + sum_{k<=order} b_k u**k - (1 + u) ** alpha| / (1 + u) ** alpha over |u| <= rho
    (a dense grid with both ends), in float64."""
    coefficients = [_binomial(alpha, k) for k in range(1, order + 1)]
    worst = 0.0
    for i in range(points):
        u = rho * (2 * i / (points - 1) - 1)
        series = 1 + sum(c * u ** (k + 1) for k, c in enumerate(coefficients))
        exact = (1 + u) ** alpha
        worst = max(worst, abs(series - exact) / exact)
    return worst


@functools.lru_cache(maxsize=64)
def taylor_constants(alpha: float, order: int = TAYLOR_ORDER,
                     tolerance: float = TAYLOR_TOLERANCE) -> tuple[float, list[float]]:
    """(rho, [b_1..b_6]): (1 + u) ** alpha = 1 + sum_{k<=order} b_k u**k within tolerance
    (relative) for |u| <= rho; b_k past the order are returned but not used.

    rho starts from the first omitted term (the remainder is below twice that term when the
    terms after it shrink by 1/2 or more, true for order 6, alpha <= 15, rho <= 1/2) and is then
    checked on a dense grid and narrowed until the error is within tolerance, which makes the
    bound hold for every order and alpha.
    """
    coefficients = [_binomial(alpha, k) for k in range(1, 7)]
    remainder = abs(_binomial(alpha, order + 1))
    if remainder == 0:  # alpha a small integer: the series is exact
        return 0.5, coefficients
    rho = min(0.5, (tolerance / 2 / remainder) ** (1 / (order + 1)))
    while taylor_series_error(alpha, order, rho) > tolerance:
        rho *= 0.9
    return rho, coefficients


def _pow2(n: int) -> int:
    return max(16, triton.next_power_of_2(n))


def long_phase(alpha: float, distance: str, max_distance: int) -> bool:
    """Whether f at the call's largest distance reaches LONG_PHASE_FROM."""
    weight = max_distance ** alpha if distance == "power" else alpha * max_distance
    return weight >= LONG_PHASE_FROM


def logits_args(*, alpha: float, distance: str, phase: str, phase_dim: int, dtype: torch.dtype,
                max_distance: int, configs: LaunchConfigs | None = None) -> tuple[list, dict]:
    """The scalars (phase_scale, alpha, taylor_rho, b1..b6, rho_in, rho_out) and flags of
    `triton_logits.tile_logits`, the same for every kernel that calls it. With `FAR_BANDS` or
    `BWD_BANDS` the radii of the series bands of orders taylor_order -/+ 1 at the same tolerance
    (rho_in, rho_out; 0 without; taylor_order 2..5); BANDS is off here, and on in the kernels
    whose own flags set it (`fwd_flags`, `dkdv_flags`, `dq_flags`)."""
    order = _chosen(configs, "taylor_order", TAYLOR_ORDER)
    tolerance = _chosen(configs, "taylor_tolerance", TAYLOR_TOLERANCE)
    rho, coefficients = taylor_constants(float(alpha), order, tolerance)
    bands = [name for name, default in (("far_bands", FAR_BANDS), ("bwd_bands", BWD_BANDS))
             if _chosen(configs, name, default)]
    rho_in = rho_out = 0.0
    if bands:
        if not 2 <= order <= 5:
            raise ValueError(f"{' and '.join(bands)}: the bands take taylor_order 2..5 (they are "
                             f"orders taylor_order -/+ 1), got {order}")
        rho_in = taylor_constants(float(alpha), order - 1, tolerance)[0]
        rho_out = taylor_constants(float(alpha), order + 1, tolerance)[0]
    scalars = [1 / math.sqrt(phase_dim), float(alpha), rho, *coefficients, rho_in, rho_out]
    flags = dict(DIST_POWER=distance == "power", PHASE_QUAD=phase == "quadratic",
                 TRIG_POLY=trig_poly(configs), TRIG_TERMS=trig_terms(configs, dtype),
                 TAYLOR_ORDER=order, BANDS=False, PTX_ASM=not interpreting(),
                 LONG_PHASE=long_phase(alpha, distance, max_distance),
                 DOT_PRECISION="ieee" if dtype == torch.float32 else "tf32")
    return scalars, flags


def _common_args(q, k, v, amp_dim, alpha, distance, phase, causal, q_offset, k_offset, configs):
    head_dim, v_dim = q.shape[-1], v.shape[-1]
    phase_dim = head_dim - amp_dim
    max_distance = max(abs(q_offset + q.shape[1] - 1 - k_offset), abs(k_offset + k.shape[1] - 1 - q_offset))
    scalars, flags = logits_args(alpha=alpha, distance=distance, phase=phase, phase_dim=phase_dim,
                                 dtype=q.dtype, max_distance=max_distance, configs=configs)
    constexprs = dict(AMP_DIM=amp_dim, HEAD_DIM=head_dim, V_DIM=v_dim, BLOCK_DA=_pow2(amp_dim),
                      BLOCK_DP=_pow2(phase_dim), BLOCK_DV=_pow2(v_dim), CAUSAL=causal, **flags)
    return [math.log2(math.e) / math.sqrt(amp_dim), *scalars], constexprs


# The last compiled kernel launched per (kernel, config, flags): their register and spill counts
# (`compiled_kernels`) are the compiler's side of a variant's timing.
_compiled: dict[tuple, object] = {}


def _remember(name: str, config: KernelConfig, constexprs: dict, compiled) -> None:
    if compiled is not None and not interpreting():
        _compiled[(name, config, tuple(sorted((k, str(v)) for k, v in constexprs.items())))] = compiled


def compiled_kernels() -> list[tuple[dict, object]]:
    """(description, Triton CompiledKernel) of every kernel launched so far in this process: the
    description has the kernel's name, config, constexpr flags, and n_regs, n_spills (local
    memory bytes / 4, as Triton reports it) and shared memory bytes when the compiler gave them."""
    rows = []
    for (name, config, flags), compiled in _compiled.items():
        metadata = getattr(compiled, "metadata", None)
        rows.append((dict(kernel=name, config=str(config), **dict(flags),
                          n_regs=getattr(compiled, "n_regs", None),
                          n_spills=getattr(compiled, "n_spills", None),
                          shared=getattr(metadata, "shared", None)), compiled))
    return rows


@functools.lru_cache(maxsize=None)
def num_sms(device_index: int) -> int:
    """The CUDA device's number of SMs."""
    return torch.cuda.get_device_properties(device_index).multi_processor_count


@functools.lru_cache(maxsize=None)
def _has_tma(device_index: int) -> bool:
    """Whether the CUDA device has Hopper's TMA (sm_90 or later); asked once per device, not at
    every launch."""
    return torch.cuda.get_device_capability(device_index)[0] >= 9


def persistent_programs(config: KernelConfig, device: torch.device, tiles: int) -> int:
    """A persistent kernel's grid: the programs that fit on the GPU at once, at most `tiles`. By
    registers only: 64k a SM over the cap's threads where the config caps them, else two 4-warp
    or one 8-warp program a SM (the uncapped kernels take 228-249 registers, run-24.md). One SM
    under the interpreter, so that each program takes several tiles."""
    threads = 32 * config.num_warps
    per_sm = 65536 // (threads * config.max_registers) if config.max_registers else 256 // threads
    sms = num_sms(device.index or 0) if device.type == "cuda" and not interpreting() else 1
    return max(1, min(tiles, sms * max(per_sm, 1)))


def tma_ok(t: torch.Tensor, widths: tuple[int, ...]) -> bool:
    """Whether a (B, N, H, D) tensor's tiles of these column widths (its parts, in order, which
    must fill D) can come by TMA descriptors: under the interpreter, or on sm_90+, with a 16-byte
    aligned base, 16-byte multiples for every stride but the last (1), every width a power of two
    of at least 16 bytes and at most 256 elements."""
    if sum(widths) != t.shape[-1] or t.stride(-1) != 1:
        return False
    if not (interpreting() or (t.is_cuda and _has_tma(t.get_device()))):
        return False
    size = t.element_size()
    return (t.data_ptr() % 16 == 0 and all(stride * size % 16 == 0 for stride in t.stride()[:-1])
            and all(w & (w - 1) == 0 and w * size >= 16 and w <= 256 for w in widths))


def tma_descriptors(t: torch.Tensor, block_rows: int, widths: tuple[int, ...]) -> list:
    """One TMA descriptor per column width for `_desc_tile` (blocks (1, block_rows, 1, width)),
    the same object for equal widths."""
    made: dict[int, TensorDescriptor] = {}
    for width in widths:
        if width not in made:
            made[width] = TensorDescriptor(t, list(t.shape), list(t.stride()),
                                           [1, block_rows, 1, width])
    return [made[width] for width in widths]


def _loop_descriptors(flags: dict, qk: torch.Tensor, vo: torch.Tensor, block_rows: int,
                      amp_dim: int) -> list:
    """A kernel's three loop-tile descriptors (qk's amplitude and phase parts, then vo whole), or
    three Nones; clears flags["TMA"] where the tensors do not allow TMA (`tma_ok`)."""
    widths = (amp_dim, qk.shape[-1] - amp_dim)
    flags["TMA"] = flags["TMA"] and tma_ok(qk, widths) and tma_ok(vo, (vo.shape[-1],))
    if not flags["TMA"]:
        return [None, None, None]
    return [*tma_descriptors(qk, block_rows, widths),
            *tma_descriptors(vo, block_rows, (vo.shape[-1],))]


def _row_strides(t: torch.Tensor):
    return t.stride(0), t.stride(1), t.stride(2)


def _contiguous_last(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def forward(q, k, v, *, amp_dim, alpha, distance, phase, causal, q_offset, k_offset,
            configs: LaunchConfigs | None = None):
    """Fused forward: out (B, Nq, H, Dv) in q's dtype and lse (B, H, Nq) float32 (natural log)."""
    check_supported(q, v)
    q, k, v = (_contiguous_last(t) for t in (q, k, v))
    batch, n_q, heads, _ = q.shape
    n_k, kv_heads = k.shape[1], k.shape[2]
    configs = configs or default_configs(q.shape[-1], v.shape[-1], q.dtype)
    cfg = forward_config(configs, n_k)
    out = torch.empty((batch, n_q, heads, v.shape[-1]), dtype=q.dtype, device=q.device)
    lse = torch.empty((batch, heads, n_q), dtype=torch.float32, device=q.device)
    scalars, constexprs = _common_args(q, k, v, amp_dim, alpha, distance, phase, causal, q_offset,
                                       k_offset, configs)
    constexprs.update(fwd_flags(configs, constexprs))
    if constexprs["COS_RADIANS"]:
        scalars, _ = with_radians(scalars)
    descriptors = _loop_descriptors(constexprs, k, v, cfg.block_n, amp_dim)
    grid = (triton.cdiv(n_q, cfg.block_m), batch * heads)
    if constexprs["PERSISTENT"]:
        grid = (persistent_programs(cfg, q.device, grid[0] * grid[1]),)
    compiled = kernels._fwd_kernel[grid](
        q, k, v, out, lse, *descriptors, *_row_strides(q), *_row_strides(k), *_row_strides(v),
        *_row_strides(out), n_q, n_k, q_offset, k_offset, heads, heads // kv_heads, batch * heads,
        *scalars,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, WARP_SPECIALIZE=cfg.warp_specialize,
        **cfg.launch_options(), **constexprs)
    _remember("fwd", cfg, constexprs, compiled)
    return out, lse


def backward(dout, dlse, q, k, v, out, lse, *, amp_dim, alpha, distance, phase, causal, q_offset,
             k_offset, configs: LaunchConfigs | None = None):
    """Fused backward: (dq, dk, dv) for the gradients dout of out and dlse (or None) of lse."""
    q, k, v, out, dout = (_contiguous_last(t) for t in (q, k, v, out, dout))
    if dlse is not None:  # the kernel indexes it as a dense (B, H, Nq); autograd may hand an expand
        dlse = dlse.contiguous()
    batch, n_q, heads, _ = q.shape
    n_k, kv_heads = k.shape[1], k.shape[2]
    v_dim = v.shape[-1]
    configs = configs or default_configs(q.shape[-1], v_dim, q.dtype)
    delta = torch.empty((batch, heads, n_q), dtype=torch.float32, device=q.device)
    preprocess_rows = 64
    kernels._bwd_preprocess_kernel[(triton.cdiv(n_q, preprocess_rows), batch * heads)](
        out, dout, dlse if dlse is not None else delta, delta, *_row_strides(out),
        *_row_strides(dout), n_q, heads, V_DIM=v_dim, BLOCK_DV=_pow2(v_dim),
        BLOCK_M=preprocess_rows, HAS_DLSE=dlse is not None)
    scalars, constexprs = _common_args(q, k, v, amp_dim, alpha, distance, phase, causal, q_offset,
                                       k_offset, configs)
    grad_scales = [1 / math.sqrt(amp_dim), -2 * math.pi / math.sqrt(amp_dim)]
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    dkdv = dkdv_flags(configs, constexprs)
    dkdv_scalars, dkdv_grad_scales = with_radians(scalars, grad_scales) if dkdv["COS_RADIANS"] else (
        scalars, grad_scales)
    dq_atomic = dkdv["DQ_ATOMIC"]
    # the atomics accumulate in float32 (like FlashAttention-2's dq_accum)
    dq = (torch.zeros(q.shape, dtype=torch.float32, device=q.device) if dq_atomic
          else torch.empty_like(q))

    cfg = configs.dkdv
    descriptors = _loop_descriptors(dkdv, q, dout, cfg.block_m, amp_dim)
    compiled = kernels._bwd_dkdv_kernel[(triton.cdiv(n_k, cfg.block_n), batch * kv_heads)](
        q, k, v, dout, lse, delta, dk, dv, dq, *descriptors, *_row_strides(q), *_row_strides(k),
        *_row_strides(v), *_row_strides(dout), *_row_strides(dk), *_row_strides(dv),
        *_row_strides(dq), n_q, n_k, q_offset, k_offset, kv_heads, heads // kv_heads, *dkdv_scalars,
        *dkdv_grad_scales, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        WARP_SPECIALIZE=cfg.warp_specialize, **cfg.launch_options(), **{**constexprs, **dkdv})
    _remember(dkdv_kernel_name(dkdv), cfg, {**constexprs, **dkdv}, compiled)
    if dq_atomic:
        return dq.to(q.dtype), dk, dv
    cfg = configs.dq
    dq_own = dq_flags(configs, constexprs)
    if dq_own["COS_RADIANS"]:
        scalars, grad_scales = with_radians(scalars, grad_scales)
    descriptors = _loop_descriptors(dq_own, k, v, cfg.block_n, amp_dim)
    compiled = kernels._bwd_dq_kernel[(triton.cdiv(n_q, cfg.block_m), batch * heads)](
        q, k, v, dout, lse, delta, dq, *descriptors, *_row_strides(q), *_row_strides(k),
        *_row_strides(v), *_row_strides(dout), *_row_strides(dq), n_q, n_k, q_offset, k_offset,
        heads, heads // kv_heads, *scalars, *grad_scales, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        WARP_SPECIALIZE=cfg.warp_specialize, **cfg.launch_options(), **{**constexprs, **dq_own})
    _remember("dq", cfg, {**constexprs, **dq_own}, compiled)
    return dq, dk, dv
