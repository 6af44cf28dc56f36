"""The argument checks of `tapa.ops.tapa.checks`: the range limits hold exactly up to their bound
(finite and as accurate as float32 allows there), and triton on a CPU tensor is a clear error."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest
import torch
from helpers import rel_rmse

from tapa.ops import MAX_ALPHA, MAX_POSITION, tapa_attention
from tapa.ops.tapa.reference import chunked_tapa_attention, naive_tapa_attention


def _qkv(q_len, k_len, seed, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(1, q_len, 4, 16, generator=gen, dtype=torch.float64).to(dtype),
            torch.randn(1, k_len, 2, 16, generator=gen, dtype=torch.float64).to(dtype),
            torch.randn(1, k_len, 2, 8, generator=gen, dtype=torch.float64).to(dtype))


def _out_lse_grads(fn, q, k, v, **kwargs):
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    out, lse = fn(q, k, v, return_lse=True, **kwargs)
    (out.sum() + lse.sum()).backward()
    return {"out": out, "lse": lse, "dq": q.grad, "dk": k.grad, "dv": v.grad}


def test_alpha_bound_is_exactly_the_overflow_limit():
    """The documented derivation: f(MAX_POSITION) = 2**96 at the bound, for both distances."""
    assert MAX_ALPHA["power"] == 4.0 and MAX_POSITION == 2**24
    assert float(MAX_POSITION) ** MAX_ALPHA["power"] == 2.0**96 == MAX_ALPHA["linear"] * MAX_POSITION
    tapa_attention(*_qkv(3, 3, 0), alpha=MAX_ALPHA["power"])  # accepted at the bound
    with pytest.raises(ValueError, match="alpha"):
        tapa_attention(*_qkv(3, 3, 0), alpha=MAX_ALPHA["power"] * (1 + 1e-9))


@pytest.mark.parametrize("distance", ["power", "linear"])
def test_reference_at_the_alpha_bound_is_finite_and_matches_float64(distance):
    alpha = MAX_ALPHA[distance]
    # the largest distances allowed: queries at the last positions, keys at the first
    q, k, v = _qkv(2, 5, seed=1)
    far = dict(alpha=alpha, distance=distance, causal=False, q_offset=MAX_POSITION - 2, k_offset=0)
    # and short range (distances 0..7), where float32 still resolves the phase
    q_near, k_near, v_near = _qkv(8, 8, seed=2)
    near = dict(alpha=alpha, distance=distance, causal=True)
    for (q, k, v), kwargs in (((q, k, v), far), ((q_near, k_near, v_near), near)):
        exact = _out_lse_grads(naive_tapa_attention, q.double(), k.double(), v.double(), **kwargs)
        for fn in (naive_tapa_attention, chunked_tapa_attention):
            got = _out_lse_grads(fn, q, k, v, **kwargs)
            for name, value in got.items():
                assert torch.isfinite(value).all(), (fn.__name__, name)
            # the phase reaches 7**4 = 2401 turns on the short range: float32 resolves it to ~1e-4
            assert rel_rmse(got["out"], exact["out"]) < 1e-3, fn.__name__
            assert rel_rmse(got["lse"], exact["lse"]) < 1e-3, fn.__name__


_TRITON_ON_CPU = """
import torch
from tapa.ops import tapa_attention, tapa_attention_with_kvcache
q = torch.randn(1, 4, 2, 16)
for call in (lambda: tapa_attention(q, q, q, impl="triton"),
             lambda: tapa_attention_with_kvcache(q, q, q, 4, impl="triton")):
    try:
        call()
    except ValueError as err:
        print("ValueError:", err)
"""


@pytest.mark.skipif(torch.cuda.is_available() or importlib.util.find_spec("triton") is None,
                    reason="needs triton and no GPU")
def test_triton_on_cpu_without_interpreter_is_a_clear_error():
    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    src = os.path.join(os.path.dirname(__file__), "..", "..", "src")
    env["PYTHONPATH"] = os.pathsep.join([os.path.abspath(src), env.get("PYTHONPATH", "")])
    result = subprocess.run([sys.executable, "-c", _TRITON_ON_CPU], capture_output=True, text=True,
                            env=env, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.count("ValueError: impl='triton' needs CUDA tensors") == 2, result.stdout
