"""The fused TAPA kernels as a differentiable torch custom op (`torch.library`).

`tapa.ops.tapa_attention` dispatches here on CUDA tensors. Registering the forward and backward
as custom ops keeps `torch.compile` from breaking the graph at the Triton launches. Importing
this module raises ImportError when triton is missing, and the dispatcher then uses the reference.

`tapa_attention_triton(..., configs=row)` runs the kernels with an explicit row of the config table
(`tapa.ops.tapa.configs.KernelConfigs`, for tests and research) through a plain autograd function
instead of the custom op.
"""

from typing import Optional

import torch

from tapa.ops.tapa import launch
from tapa.ops.tapa.configs import KernelConfigs
from tapa.ops.tapa.launch import interpreting  # noqa: F401  (the dispatcher asks it)
from tapa.ops.tapa.reference import split_dims


def supports(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, theta: float) -> bool:
    """Whether the fused kernel handles these inputs (dtype and head sizes)."""
    try:
        launch.check_supported(q, v)
    except ValueError:
        return False
    return True


@torch.library.custom_op("tapa::fused_attention_fwd", mutates_args=())
def _fused_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, amp_dim: int, alpha: float,
                   distance: str, phase: str, causal: bool, q_offset: int,
                   k_offset: int) -> tuple[torch.Tensor, torch.Tensor]:
    return launch.forward(q, k, v, amp_dim=amp_dim, alpha=alpha, distance=distance, phase=phase,
                          causal=causal, q_offset=q_offset, k_offset=k_offset)


@_fused_forward.register_fake
def _(q, k, v, amp_dim, alpha, distance, phase, causal, q_offset, k_offset):
    batch, n_q, heads, _ = q.shape
    return (q.new_empty((batch, n_q, heads, v.shape[-1])),
            q.new_empty((batch, heads, n_q), dtype=torch.float32))


@torch.library.custom_op("tapa::fused_attention_bwd", mutates_args=())
def _fused_backward(dout: torch.Tensor, dlse: Optional[torch.Tensor], q: torch.Tensor,
                    k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                    amp_dim: int, alpha: float, distance: str, phase: str, causal: bool,
                    q_offset: int,
                    k_offset: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return launch.backward(dout, dlse, q, k, v, out, lse, amp_dim=amp_dim, alpha=alpha,
                           distance=distance, phase=phase, causal=causal, q_offset=q_offset,
                           k_offset=k_offset)


@_fused_backward.register_fake
def _(dout, dlse, q, k, v, out, lse, amp_dim, alpha, distance, phase, causal, q_offset, k_offset):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output):
    q, k, v, *params = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.params = params


def _backward(ctx, dout, dlse):
    q, k, v, out, lse = ctx.saved_tensors
    if dout is None:
        dout = torch.zeros_like(out)
    dq, dk, dv = _fused_backward(dout, dlse, q, k, v, out, lse, *ctx.params)
    return (dq, dk, dv) + (None,) * len(ctx.params)


torch.library.register_autograd("tapa::fused_attention_fwd", _backward,
                                setup_context=_setup_context)


_PARAMS = ("amp_dim", "alpha", "distance", "phase", "causal", "q_offset", "k_offset")


class _WithConfigs(torch.autograd.Function):
    """The fused forward and backward with an explicit `KernelConfigs` (not traced by
    torch.compile as the custom op is)."""

    @staticmethod
    def forward(ctx, q, k, v, configs, *params):
        ctx.configs, ctx.params = configs, dict(zip(_PARAMS, params))
        out, lse = launch.forward(q, k, v, configs=configs, **ctx.params)
        ctx.save_for_backward(q, k, v, out, lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        if dout is None:
            dout = torch.zeros_like(out)
        dq, dk, dv = launch.backward(dout, dlse, q, k, v, out, lse, configs=ctx.configs,
                                     **ctx.params)
        return (dq, dk, dv, None) + (None,) * len(_PARAMS)


def tapa_attention_triton(q, k, v, *, theta, alpha, distance, phase, causal, q_offset, k_offset,
                          return_lse, configs: KernelConfigs | None = None):
    """The fused kernel behind `tapa.ops.tapa_attention` (arguments already checked there).
    configs: an explicit row to launch with (default: the table's, through the custom op)."""
    launch.check_supported(q, v)
    amp_dim, _ = split_dims(q.shape[-1], theta)
    params = (amp_dim, float(alpha), distance, phase, bool(causal), int(q_offset), int(k_offset))
    if configs is None:
        out, lse = _fused_forward(q, k, v, *params)
    else:
        out, lse = _WithConfigs.apply(q, k, v, configs, *params)
    return (out, lse) if return_lse else out


# ---------------------------------------------------------------------------------------------
# Packed sequences (varlen)


@torch.library.custom_op("tapa::fused_varlen_fwd", mutates_args=())
def _varlen_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                    cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, amp_dim: int,
                    alpha: float, distance: str, phase: str,
                    causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    varlen = launch.Varlen(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    return launch.forward(q, k, v, amp_dim=amp_dim, alpha=alpha, distance=distance, phase=phase,
                          causal=causal, q_offset=0, k_offset=0, varlen=varlen)


@_varlen_forward.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, amp_dim, alpha, distance,
      phase, causal):
    total_q, heads, _ = q.shape
    return (q.new_empty((total_q, heads, v.shape[-1])),
            q.new_empty((heads, total_q), dtype=torch.float32))


@torch.library.custom_op("tapa::fused_varlen_bwd", mutates_args=())
def _varlen_backward(dout: torch.Tensor, dlse: Optional[torch.Tensor], q: torch.Tensor,
                     k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                     cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, max_seqlen_q: int,
                     max_seqlen_k: int, amp_dim: int, alpha: float, distance: str, phase: str,
                     causal: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    varlen = launch.Varlen(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    return launch.backward(dout, dlse, q, k, v, out, lse, amp_dim=amp_dim, alpha=alpha,
                           distance=distance, phase=phase, causal=causal, q_offset=0, k_offset=0,
                           varlen=varlen)


@_varlen_backward.register_fake
def _(dout, dlse, q, k, v, out, lse, *params):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _varlen_setup_context(ctx, inputs, output):
    q, k, v, cu_q, cu_k, *params = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k)
    ctx.params = params


def _varlen_grads(ctx, dout, dlse):
    q, k, v, out, lse, cu_q, cu_k = ctx.saved_tensors
    if dout is None:
        dout = torch.zeros_like(out)
    dq, dk, dv = _varlen_backward(dout, dlse, q, k, v, out, lse, cu_q, cu_k, *ctx.params)
    return (dq, dk, dv, None, None) + (None,) * len(ctx.params)


torch.library.register_autograd("tapa::fused_varlen_fwd", _varlen_grads,
                                setup_context=_varlen_setup_context)


def tapa_attention_varlen_triton(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                 *, theta, alpha, distance, phase, causal, return_lse):
    """The fused kernel behind `tapa.ops.tapa.varlen.tapa_attention_varlen` (arguments checked
    there): out (total_q, H, Dv) and lse (H, total_q)."""
    launch.check_supported(q, v)
    amp_dim, _ = split_dims(q.shape[-1], theta)
    out, lse = _varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q),
                               int(max_seqlen_k), amp_dim, float(alpha), distance, phase,
                               bool(causal))
    return (out, lse) if return_lse else out
