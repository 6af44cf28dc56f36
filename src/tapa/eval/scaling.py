"""Eval-time positional scaling: which RoPE-family methods get a factor at a given length, how to
evaluate one trained RoPE model under another scaling rule (the rotation has no weights), and how
to evaluate any model with the global layers' log-length query temperature."""

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
    source = model.config.pe
    if pe == source:
        return model
    if source not in ROPE_FAMILY or pe not in ROPE_FAMILY:
        raise ValueError(f"pe: only RoPE-family models can be re-evaluated under another RoPE rule, "
                         f"got model pe {source!r} -> {pe!r}")
    return _copy_with(model, pe=pe, rope_scale=1.0, original_seq_len=int(train_len))


def _copy_with(model, **fields):
    """An eval-mode copy of `model` (its weights, device and dtype) whose config differs in
    `fields`, which carry no weights."""
    from tapa.model import ModelConfig, TapaLM

    config = ModelConfig.from_dict({**model.config.to_dict(), **fields})
    parameter = next(model.parameters())
    variant = TapaLM(config).to(device=parameter.device, dtype=parameter.dtype)
    variant.load_state_dict(model.state_dict(), strict=True)
    variant.eval()
    return variant


def check_query_temperature(base, scale, names=("base", "scale")) -> None:
    """ValueError unless `base` is an int >= 1 (positions) and `scale` a finite number > 0: a query
    temperature that is on, as evaluation applies it (the model config also takes base 0, off).
    `names`: what the caller calls the two."""
    if isinstance(base, bool) or not isinstance(base, int) or base < 1:
        raise ValueError(f"{names[0]} must be an int >= 1 (the query temperature's base, in positions), "
                         f"got {base!r}")
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not 0 < scale < float("inf"):
        raise ValueError(f"{names[1]} must be a finite number > 0 (the query temperature's slope), "
                         f"got {scale!r}")


def with_query_temperature(model, base: int, scale: float = 0.1):
    """A copy of `model` whose global layers scale each query at position p by
    1 + scale * log(1 + floor((p + 1) / base)) (`ModelConfig.query_temperature_base`, Llama 4's
    form; TAPA's amplitude part only): the temperature at evaluation for a model trained without it
    or with another base. Positions below base - 1 are untouched. The weights are copied."""
    check_query_temperature(base, scale)
    if "G" not in model.config.layer_pattern:  # validate refuses a G that never reaches a layer
        raise ValueError("a query temperature acts on global layers; this model has none")
    return _copy_with(model, query_temperature_base=base, query_temperature_scale=scale)
