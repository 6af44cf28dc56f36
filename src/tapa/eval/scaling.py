"""Eval-time positional scaling: which RoPE-family methods get a factor at a given length, and how
to evaluate one trained RoPE model under another scaling rule (the rotation has no weights)."""

from __future__ import annotations

from contextlib import contextmanager

from tapa.positional.kinds import ROPE_FAMILY, SCALED_AT_EVAL

# SCALED_AT_EVAL (from the registry): methods whose factor is set from the eval length (factor =
# eval_len / train_len, never below 1). rope-dynamic-ntk adapts by itself; rope has no scaling;
# tapa* and nope have nothing to scale. Scaling applies to global layers only: local layers never
# see a distance beyond their window.


def eval_rope_factor(pe: str, eval_len: int, train_len: int, trained_factor: float = 1.0) -> float:
    """The scaling factor a method gets at `eval_len` for a model trained at `train_len`:
    eval_len / train_len, never below the factor it was trained with (1.0 for a plain pretrained
    model)."""
    if train_len <= 0:
        raise ValueError(f"train_len must be positive, got {train_len}")
    if pe not in SCALED_AT_EVAL:
        return 1.0
    return max(trained_factor, eval_len / train_len)


@contextmanager
def rope_scaling_at(model, eval_len: int, train_len: int):
    """Apply the method's eval-time factor for `eval_len` inside the block, restore it after.

    Yields the factor used (1.0 for methods that get none).
    """
    config = model.config
    factor = eval_rope_factor(config.pe, eval_len, train_len, config.rope_scale)
    if config.pe not in SCALED_AT_EVAL:
        yield factor
        return
    previous = config.rope_scale
    model.set_rope_scale(factor)
    try:
        yield factor
    finally:
        model.set_rope_scale(previous)


def with_positional(model, pe: str, train_len: int):
    """A copy of a RoPE-family `model` that uses scaling rule `pe` in its global layers (e.g. a
    plain-RoPE model evaluated with PI or YaRN). The weights are copied; only the rotation differs. The copy's
    scaling refers to `train_len` (config.original_seq_len, used by YaRN and dynamic NTK).
    """
    from tapa.model import ModelConfig, TapaLM

    source = model.config.pe
    if pe == source:
        return model
    if source not in ROPE_FAMILY or pe not in ROPE_FAMILY:
        raise ValueError(f"pe: only RoPE-family models can be re-evaluated under another RoPE rule, "
                         f"got model pe {source!r} -> {pe!r}")
    config = ModelConfig.from_dict({**model.config.to_dict(), "pe": pe, "rope_scale": 1.0,
                                      "original_seq_len": int(train_len)})
    parameter = next(model.parameters())
    variant = TapaLM(config).to(device=parameter.device, dtype=parameter.dtype)
    variant.load_state_dict(model.state_dict(), strict=True)
    variant.eval()
    return variant
