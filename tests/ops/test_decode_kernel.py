"""The split-KV decode kernel against the float64 reference (Triton interpreter on CPU)."""

from __future__ import annotations

import inspect
from dataclasses import replace

import pytest
import torch

pytest.importorskip("triton")  # without CUDA, conftest.py has selected Triton's interpreter
from helpers import rel_rmse  # noqa: E402

from tapa.ops.tapa import decode_kernel  # noqa: E402
from tapa.ops.tapa.reference import naive_tapa_attention  # noqa: E402


DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def reference(q, k_cache, v_cache, lengths, starts, **op_args):
    """Per sequence: the naive op on its valid keys, queries at the last q_len slots."""
    outs, lses = [], []
    for row in range(q.shape[0]):
        first = 0 if starts is None else int(starts[row])
        stop = int(lengths[row])
        out, lse = naive_tapa_attention(q[row:row + 1], k_cache[row:row + 1, first:stop],
                                        v_cache[row:row + 1, first:stop], q_offset=stop - q.shape[1],
                                        k_offset=first, return_lse=True, **op_args)
        outs.append(out)
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses)


def random_case(batch, q_len, heads, kv_heads, head_dim, capacity, dtype, *, seed, transposed_cache=True):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, q_len, heads, head_dim, generator=gen).to(DEVICE, dtype)
    if transposed_cache:  # the layout transformers' caches use: (B, Hk, S, D), viewed as (B, S, Hk, D)
        k = torch.randn(batch, kv_heads, capacity, head_dim, generator=gen).to(DEVICE, dtype).transpose(1, 2)
    else:
        k = torch.randn(batch, capacity, kv_heads, head_dim, generator=gen).to(DEVICE, dtype)
    v = torch.randn(batch, capacity, kv_heads, head_dim, generator=gen).to(DEVICE, dtype)
    lengths = torch.randint(q_len, capacity + 1, (batch,), generator=gen, dtype=torch.int32)
    lengths[0] = capacity  # one full cache
    starts = (torch.rand(batch, generator=gen) * (lengths - q_len).float()).to(torch.int32)
    return q, k, v, lengths.to(DEVICE), starts.to(DEVICE)


CASES = [
    # batch, q_len, heads, kv_heads, head_dim, capacity, num_splits, theta, distance, phase
    (3, 1, 8, 2, 64, 300, None, 0.5, "power", "quadratic"),
    (2, 3, 4, 4, 48, 203, 3, 0.3, "linear", "quadratic"),
    (2, 2, 6, 3, 32, 130, 1, 0.75, "power", "linear"),
    (1, 1, 4, 1, 40, 77, 5, 0.5, "power", "quadratic"),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("with_starts", [False, True])
def test_decode_matches_reference(case, dtype, with_starts, monkeypatch):
    batch, q_len, heads, kv_heads, head_dim, capacity, splits, theta, distance, phase = case
    q, k, v, lengths, starts = random_case(batch, q_len, heads, kv_heads, head_dim, capacity, dtype,
                                           seed=CASES.index(case))
    starts = starts if with_starts else None
    op_args = dict(theta=theta, alpha=0.1 if distance == "power" else 0.05, distance=distance, phase=phase)

    # poison every buffer the kernel allocates: each element it should write must be written
    real_empty = torch.empty

    def poisoned_empty(*args, **kwargs):
        t = real_empty(*args, **kwargs)
        return t.fill_(float("nan")) if t.is_floating_point() else t

    monkeypatch.setattr(torch, "empty", poisoned_empty)
    out, lse = decode_kernel.tapa_decode_attention(q, k, v, lengths, cache_starts=starts,
                                                   num_splits=splits, return_lse=True, **op_args)
    monkeypatch.setattr(torch, "empty", real_empty)
    assert not out.isnan().any() and not lse.isnan().any()

    exact_out, exact_lse = reference(q.double(), k.double(), v.double(), lengths, starts, **op_args)
    same_dtype_out, _ = reference(q, k, v, lengths, starts, **op_args)
    err = rel_rmse(out, exact_out)
    ref_err = rel_rmse(same_dtype_out, exact_out)
    assert err <= 2 * ref_err + 1e-6, (err, ref_err)
    assert rel_rmse(lse, exact_lse) < 1e-5


def test_splits_agree_and_lengths_are_per_sequence():
    """The split count changes only rounding; a sequence's result ignores slots past its length."""
    q, k, v, lengths, _ = random_case(2, 1, 4, 2, 32, 150, torch.float32, seed=3)
    one = decode_kernel.tapa_decode_attention(q, k, v, lengths, num_splits=1)
    many = decode_kernel.tapa_decode_attention(q, k, v, lengths, num_splits=7)
    assert rel_rmse(many, one) < 1e-6
    k_garbage, v_garbage = k.clone(), v.clone()
    for row, length in enumerate(lengths.tolist()):
        k_garbage[row, length:] = 1e4
        v_garbage[row, length:] = float("nan")
    garbage = decode_kernel.tapa_decode_attention(q, k_garbage, v_garbage, lengths, num_splits=7)
    assert torch.equal(garbage, many)


def test_decode_bad_input():
    q, k, v, lengths, starts = random_case(2, 1, 4, 2, 32, 40, torch.float32, seed=1)
    with pytest.raises(ValueError, match="cache_seqlens"):
        decode_kernel.tapa_decode_attention(q, k, v, lengths.long())
    with pytest.raises(ValueError, match="cache_seqlens"):
        decode_kernel.tapa_decode_attention(q, k, v, torch.tensor([41, 3], dtype=torch.int32, device=DEVICE))
    with pytest.raises(ValueError, match="cache_leftpad"):
        decode_kernel.tapa_decode_attention(q, k, v, lengths, cache_starts=lengths)
    with pytest.raises(ValueError, match="multiple of kv heads"):
        decode_kernel.tapa_decode_attention(q[:, :, :3], k, v, lengths)
    with pytest.raises(ValueError, match="dtype"):
        decode_kernel.tapa_decode_attention(q.half(), k, v, lengths)
    with pytest.raises(ValueError, match="theta"):
        decode_kernel.tapa_decode_attention(q, k, v, lengths, theta=1.0)
    with pytest.raises(ValueError, match="distance"):
        decode_kernel.tapa_decode_attention(q, k, v, lengths, distance="log")
    with pytest.raises(ValueError, match="<= 64"):
        decode_kernel.tapa_decode_attention(q.expand(2, 40, 4, 32), k, v, lengths)


def test_a_decoding_loop_checks_each_call_signature_once(monkeypatch):
    """The checks and launch arithmetic run once per call signature (shapes, strides, dtypes,
    settings), not at every decoding step; the cached launch gives the uncached result, and any
    change of signature, valid or not, is checked again."""
    q, k, v, lengths, starts = random_case(2, 1, 4, 2, 32, 150, torch.float32, seed=4)
    decode_kernel._PLANS.clear()
    checks = []
    real_check = decode_kernel._check
    monkeypatch.setattr(decode_kernel, "_check", lambda *a: (checks.append(a[5:]), real_check(*a)))
    first = decode_kernel.tapa_decode_attention(q, k, v, lengths, cache_starts=starts, num_splits=5)
    steps = [decode_kernel.tapa_decode_attention(q, k, v, lengths - i, cache_starts=starts, num_splits=5)
             for i in range(3)]  # a loop: new length values, same signature
    assert len(checks) == 1 and torch.equal(steps[0], first)
    (plan,) = decode_kernel._PLANS.values()  # later steps launch the kernel with the kept config
    assert plan.split_config is not None and "BLOCK_N" in plan.split_config
    decode_kernel._PLANS.clear()
    for i in (1, 2):  # the cached launch computes what a fresh one does
        assert torch.equal(steps[i], decode_kernel.tapa_decode_attention(q, k, v, lengths - i,
                                                                         cache_starts=starts, num_splits=5))
    decode_kernel.tapa_decode_attention(q, k, v, lengths, alpha=0.2)  # another setting: checked
    assert checks[-1][1] == 0.2
    with pytest.raises(ValueError, match="alpha"):
        decode_kernel.tapa_decode_attention(q, k, v, lengths, alpha=float("nan"))
    with pytest.raises(ValueError, match="alpha"):
        decode_kernel.tapa_decode_attention(q, k, v, lengths, alpha=True)  # == 1, but not a number
    with pytest.raises(ValueError, match="dtype"):
        decode_kernel.tapa_decode_attention(q, k, v.half(), lengths)
    with pytest.raises(ValueError, match="cache_seqlens"):
        decode_kernel.tapa_decode_attention(q, k, v, lengths[:1])
    for bad in (0, -1, 2.0, True):  # a float 2.0 equals 2 (cached above): still refused
        with pytest.raises(ValueError, match="num_splits"):
            decode_kernel.tapa_decode_attention(q, k, v, lengths, cache_starts=starts, num_splits=bad)
    calls = len(checks)  # a plan made under other decode configs is not reused
    monkeypatch.setattr(decode_kernel, "DECODE", replace(decode_kernel.DECODE, taylor_order=4))
    decode_kernel.tapa_decode_attention(q, k, v, lengths, cache_starts=starts, num_splits=5)
    assert len(checks) == calls + 1


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_decode_long_cache_cuda(dtype):
    """bf16 (which the interpreter cannot check) on a long ragged cache, 32 q heads on 8 kv heads."""
    q, k, v, lengths, starts = random_case(3, 1, 32, 8, 128, 20000, dtype, seed=5)
    for cache_starts in (None, starts):
        out = decode_kernel.tapa_decode_attention(q, k, v, lengths, cache_starts=cache_starts)
        exact, _ = reference(q.double(), k.double(), v.double(), lengths, cache_starts)
        same_dtype, _ = reference(q, k, v, lengths, cache_starts)
        assert rel_rmse(out, exact) <= 2 * rel_rmse(same_dtype, exact) + 1e-6


def test_a_direct_launch_hands_the_launcher_what_the_jit_would():
    """`_direct_launch` on a stand-in for Triton's CompiledKernel: a three-dimensional grid (the
    launcher reads grid[2]) and every argument in the kernel's order, constexprs last."""
    seen = {}

    class Compiled:
        def __getitem__(self, grid):
            seen["grid"] = grid
            return lambda *args: seen.setdefault("args", args)

    names = decode_kernel._merge_kernel.arg_names
    runtime = tuple(range(names.index("BLOCK_S")))
    launch = decode_kernel._direct_launch(Compiled(), decode_kernel._merge_kernel, (6, 3),
                                          dict(BLOCK_DV=64, BLOCK_S=8, num_warps=4))
    launch(*runtime)
    assert seen["grid"] == (6, 3, 1)
    assert seen["args"] == (*runtime, 8, 64) and len(seen["args"]) == len(names)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (the interpreter has no compiled kernel)")
def test_later_steps_launch_the_compiled_kernels_directly(monkeypatch):
    """From the third step of a signature (the first tunes, the second keeps what Triton compiled)
    the split and merge kernels launch without Triton's JIT, with the JIT's results; a caller
    tensor whose pointer alignment differs from the compiled one goes back through the JIT."""
    q, k, v, lengths, _ = random_case(2, 1, 8, 2, 64, 3000, torch.bfloat16, seed=6)
    decode_kernel._PLANS.clear()
    for _ in range(2):
        decode_kernel.tapa_decode_attention(q, k, v, lengths, num_splits=4)
    (plan,) = decode_kernel._PLANS.values()
    assert plan.split_launch is not None and plan.merge_launch is not None
    by_jit = [decode_kernel.tapa_decode_attention(q, k, v, lengths - i, num_splits=4, return_lse=True)
              for i in (0, 1)]
    decode_kernel._PLANS.clear()
    for _ in range(2):
        decode_kernel.tapa_decode_attention(q, k, v, lengths, num_splits=4)

    def no_jit(*args, **kwargs):
        raise AssertionError("a later step went through JITFunction.run")

    for kernel in (decode_kernel._split_kernel, decode_kernel._merge_kernel):
        monkeypatch.setattr(kernel, "run", no_jit)
    for i, (out, lse) in zip((0, 1), by_jit):
        direct = decode_kernel.tapa_decode_attention(q, k, v, lengths - i, num_splits=4, return_lse=True)
        assert torch.equal(direct[0], out) and torch.equal(direct[1], lse)
    shifted = torch.empty(q.numel() + 1, dtype=q.dtype, device=q.device)[1:].view(q.shape)
    shifted.copy_(q)  # the same plan (shape, strides, dtype), a 2-byte aligned pointer
    with pytest.raises(AssertionError, match="JITFunction.run"):
        decode_kernel.tapa_decode_attention(shifted, k, v, lengths, num_splits=4)
    monkeypatch.undo()
    assert torch.equal(decode_kernel.tapa_decode_attention(shifted, k, v, lengths, num_splits=4), by_jit[0][0])


def test_the_tuned_tile_depends_on_the_program_count():
    """The autotuner keys the split kernel's tile on the number of programs as well as the split
    length: batch 1 and batch 8 with splits of one length bucket get separate tunings (Run 6)."""
    assert {"split_bucket", "program_bucket"} <= set(decode_kernel._tuned_split_kernel.keys)
    decode_kernel._PLANS.clear()
    buckets = []
    for batch in (1, 8):
        q, k, v, lengths, _ = random_case(batch, 1, 4, 2, 32, 150, torch.float32, seed=batch)
        decode_kernel.tapa_decode_attention(q, k, v, lengths, num_splits=3)
        plan = next(p for p in decode_kernel._PLANS.values() if p.split_grid[0] == batch * 2)
        args = dict(zip(decode_kernel._split_kernel.arg_names[7:], plan.split_tail))  # after 7 tensors
        buckets.append((args["split_bucket"], args["program_bucket"]))
    assert buckets[0][0] == buckets[1][0] and buckets[0][1] != buckets[1][1], buckets


def test_the_tuning_buckets_do_not_specialize_the_kernel():
    """The buckets are only the autotuner's key: Triton must not compile a kernel per bucket value
    (a bucket of 16 is divisible by 16, which Triton specializes on), and the kernel body must not
    read them, or not specializing them could change its code."""
    kernel = decode_kernel._split_kernel
    body = inspect.getsource(kernel.fn).split('"""', 2)[2]  # after the signature and docstring
    assert "split_bucket" not in body and "program_bucket" not in body
    assert "keys_per_split" in body  # the loop bounds: this one stays specialized
    if hasattr(kernel, "params"):  # a JITFunction (a GPU)
        unspecialized = {p.name for p in kernel.params if p.do_not_specialize}
    else:  # the interpreter keeps the decorator's arguments (older Triton in its rewriter only)
        decorator = getattr(kernel, "kwargs", None) or getattr(kernel.rewriter, "kwargs", {})
        unspecialized = set(decorator.get("do_not_specialize") or ())
    assert unspecialized == {"split_bucket", "program_bucket"}


def test_each_autotuning_is_kept_with_every_tiles_time(monkeypatch):
    """`tile_trials`: per tuned key, every tile's median time (do_bench's first quantile; inf kept
    for a tile that failed) and the tile picked; none where the tuner timed nothing new."""
    monkeypatch.setattr(decode_kernel, "_TRIALS", [])
    configs = decode_kernel._TUNED_CONFIGS
    names = [f"{c.kwargs['BLOCK_N']}x{c.num_warps}" for c in configs]

    class Tuner:  # the two fields of triton's Autotuner the record reads
        cache = {("old",): configs[0]}
        configs_timings = {configs[0]: [1.0, 0.9, 1.1]}

    tuner = Tuner()
    before = tuner.configs_timings
    tuner.configs_timings = {c: [0.5 + i, 0.4 + i, 0.6 + i] for i, c in enumerate(configs)}
    tuner.configs_timings[configs[-1]] = [float("inf")] * 3
    tuner.cache = {**tuner.cache, ("new",): configs[0]}
    decode_kernel._record_trial(tuner, before)
    (trial,) = decode_kernel.tile_trials()
    assert trial["key"] == ("new",) and trial["best"] == names[0]
    assert trial["tiles_ms"] == {**{n: 0.5 + i for i, n in enumerate(names[:-1])}, names[-1]: float("inf")}
    trial["tiles_ms"].clear()  # a copy: the record stays
    assert len(decode_kernel.tile_trials()[0]["tiles_ms"]) == len(configs)

    # a key tuned without timing (one config left): no stale times from the tuning before
    tuner.cache = {**tuner.cache, ("single",): configs[1]}
    decode_kernel._record_trial(tuner, tuner.configs_timings)
    assert decode_kernel.tile_trials()[1] == {"key": ("single",), "tiles_ms": {}, "best": names[1]}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the autotuner runs on a GPU only")
def test_a_new_bucket_records_its_tuning_on_the_gpu(monkeypatch):
    """A first call in an untuned bucket records one tuning: every tile timed, the fastest
    picked; a second call of the same signature records nothing more."""
    monkeypatch.setattr(decode_kernel._tuned_split_kernel, "cache", {})  # every bucket untuned
    monkeypatch.setattr(decode_kernel, "_TRIALS", [])
    decode_kernel._PLANS.clear()
    q, k, v, lengths, _ = random_case(3, 1, 4, 2, 64, 777, torch.bfloat16, seed=11)
    for _ in range(2):
        decode_kernel.tapa_decode_attention(q, k, v, lengths, num_splits=5)
    (trial,) = decode_kernel.tile_trials()
    assert len(trial["tiles_ms"]) == len(decode_kernel._TUNED_CONFIGS)
    assert trial["tiles_ms"][trial["best"]] == min(trial["tiles_ms"].values())
    decode_kernel._PLANS.clear()  # the plans hold configs tuned under the stand-in cache
