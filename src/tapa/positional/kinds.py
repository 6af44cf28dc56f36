"""The registry of positional encodings: one object per kind that a model's global layers can use.

Model, transformers adapter, training, evaluation, theory and conversion read these objects and
nothing else, so a new kind is one entry here (plus, for a new RoPE rule, its frequencies in
`tapa.positional.rope_frequencies`).

Local layers (`layer_pattern` code "L") are not a kind of their own: they always use plain RoPE
(`rope_base`, no scaling) inside a causal sliding window, and never see a distance beyond it, so
eval-time scaling never applies to them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PositionalKind:
    """name: the `pe` string. label: how tables and plots name a model trained with it.
    family: "tapa" (TAPA op), "rope" (rotated q/k, softmax attention) or "nope" (softmax, no
    positions). variant: the RoPE method of `rope_frequencies` for the rope family, the TAPA phase
    variant for the tapa family. scaled_at_eval: evaluation at a longer length sets its factor to
    eval_len / train_len (PI, static NTK, YaRN)."""

    name: str
    label: str
    family: str
    variant: str = "none"
    scaled_at_eval: bool = False

    @property
    def rope_method(self) -> str:
        return self.variant if self.family == "rope" else "none"

    @property
    def phase(self) -> str:
        return self.variant if self.family == "tapa" else "quadratic"


KINDS: dict[str, PositionalKind] = {kind.name: kind for kind in (
    PositionalKind("tapa", "TAPA", "tapa", "quadratic"),
    PositionalKind("tapa-linear-phase", "TAPA (linear phase)", "tapa", "linear"),
    PositionalKind("rope", "RoPE", "rope", "rope"),
    PositionalKind("rope-pi", "PI", "rope", "pi", scaled_at_eval=True),
    PositionalKind("rope-ntk", "NTK", "rope", "ntk", scaled_at_eval=True),
    PositionalKind("rope-dynamic-ntk", "Dynamic NTK", "rope", "dynamic-ntk"),
    PositionalKind("rope-yarn", "YaRN", "rope", "yarn", scaled_at_eval=True),
    PositionalKind("nope", "NoPE", "nope"),
)}
ROPE_FAMILY = tuple(name for name, kind in KINDS.items() if kind.family == "rope")
SCALED_AT_EVAL = tuple(name for name, kind in KINDS.items() if kind.scaled_at_eval)


def get_kind(pe: str) -> PositionalKind:
    """The registry entry for `pe`; ValueError naming the choices otherwise."""
    try:
        return KINDS[pe]
    except (KeyError, TypeError):
        raise ValueError(f"pe must be one of {list(KINDS)}, got {pe!r}") from None


def method_label(trained_pe: str, eval_pe: str | None = None) -> str:
    """'RoPE', 'TAPA', ...; a model evaluated under another RoPE rule is 'RoPE+YaRN' etc."""
    trained = get_kind(trained_pe).label
    if eval_pe is None or eval_pe == trained_pe:
        return trained
    return f"{trained}+{get_kind(eval_pe).label}"


def temperature_label(base: int, scale: float = 0.1) -> str:
    """The global layers' query temperature in a label: 'query temperature 512', and its slope when
    not Llama 4's 0.1 ('query temperature 512 x0.2')."""
    return f"query temperature {base}" + ("" if scale == 0.1 else f" x{scale:g}")


def model_label(pe: str, layer_pattern: str = "G", local_window: int = 0, eval_pe: str | None = None,
                query_temperature: tuple[int, float] | None = None) -> str:
    """A model's name in results: the kind's label, for hybrids e.g. 'TAPA hybrid (LLLG, w256)', and a
    query temperature (base, scale) it was built with, e.g. 'NoPE hybrid (LLLG, w256, query
    temperature 512)' or 'TAPA (query temperature 512)'."""
    label = method_label(pe, eval_pe)
    details = [layer_pattern, f"w{local_window}"] if "L" in layer_pattern else []
    if query_temperature and query_temperature[0]:
        details.append(temperature_label(*query_temperature))
    if "L" in layer_pattern:
        return f"{label} hybrid ({', '.join(details)})"
    return f"{label} ({details[0]})" if details else label
