"""`tapa convert SRC_DIR OUT_DIR`: a RoPE model -> a TAPA (or hybrid) model directory.

The starting point for continual pretraining of an existing model with TAPA attention.
Supported families (transformers' Llama layout): Llama, Mistral, Qwen2 (its q/k/v biases become
the decoder's `attention_bias`) and Qwen3 (its per-head q_norm/k_norm become `qk_norm`). Any other
model_type is refused in one line naming these.
tapa's own RoPE models convert too (`tapa.hf.rope_source`): a `tapa train --pe rope` run (or one
of a RoPE rule) whose layers are all global, given as a run, a checkpoint or a `tapa export`
directory; a TAPA, NoPE or hybrid one is refused in one line. Its tokenizer travels with it: the
run's (from its token cache), or the export's files.

Layers (`--layer-pattern`, e.g. LLLG, repeated over the layers as in training):
- local layers (L) keep the checkpoint's q/k weights exactly; they use plain RoPE with the
  checkpoint's rope_theta inside a sliding window of `--local-window` tokens, so inside the window
  a local layer computes what the original layer computes (a checkpoint with a rope_type other
  than "default", e.g. Llama 3's, is converted with a warning: local layers drop that scaling; so
  is a tapa source of a RoPE rule other than plain rope, or with a query temperature);
- global layers (G) take `--pe`: TAPA (the split below), NoPE (the same weights, no rotary), or a
  RoPE rule (the same weights; rope, pi, ntk, dynamic-ntk, yarn).

Every weight is kept; in TAPA global layers only the q/k rows are reordered and rescaled, per head:

- Order. Llama's rotary layout pairs dim i with dim i + D/2 (rotate_half) at frequency
  base^(-2i/D); tapa's decoder (`tapa.positional.rope`) has the same layout and frequencies, so a
  tapa RoPE model's rows split the same way (its RoPE rules only rescale each pair's frequency:
  the split goes by pair, the same bands as for Llama). TAPA has no rotation; it splits each head
  into an amplitude part (the first d_A = round(theta * D) dims) and a phase part (the rest).
  The rows are reordered pair by pair from the lowest frequency to the highest, so the amplitude
  part receives the low-frequency pairs, which RoPE barely rotates over the trained context
  (content more than position), and the phase part the high-frequency ones. The same order for
  q and k keeps every q.k product.
- Scale. Llama divides q.k by sqrt(D); TAPA divides the amplitude q_A.k_A by sqrt(d_A). The
  amplitude rows of W_q are multiplied by sqrt(d_A / D), so the amplitude logit equals Llama's
  contribution of those dims, q_A.k_A / sqrt(D).
- Phase. The phase rows of W_q and W_k are multiplied by --phase-init-scale (as the model's own
  init does). At 0 the phase phi is 0 and cos(2 pi f phi) = 1: attention is exactly Llama's
  attention without rotary, on the amplitude dims (this is how the tests check the conversion).
- Biases (Qwen2) are rows of the projection: reordered and rescaled with them. With QK-norm
  (Qwen3) the norm's RMS runs over the whole head, which a rescaled row would change, so W_q, W_k
  and their biases are only reordered, and both scales go on the q_norm/k_norm weights (reordered
  the same way), which act after the RMS: the same products as without the norm.

Features TAPA's decoder lacks are refused with a ValueError (an output-projection or MLP bias, an
activation other than SiLU). A head_dim other than hidden_size / heads (Qwen3-0.6B's) is kept.
Tokenizer and generation files are copied.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import warnings
from pathlib import Path

import torch

from tapa._optional import require
from tapa._paths import check_output_dir, replacing_outputs
from tapa.hf.export import _NO_TOKENIZER_HINT, run_tokenizer, save_tokenizer
from tapa.hf.rope_source import (SUPPORTED_TAPA_LINE, RopeSource, hybrid_config, is_tapa_source,
                                 read_rope_source)
from tapa.hf.writer import MODEL_FILES, TOKENIZER_FILES, write_pretrained
from tapa.model.loading import MODEL_TYPE, read_json
from tapa.model import ModelConfig
from tapa.ops import PHASES, split_dims
from tapa.positional.kinds import KINDS, get_kind

SUPPORTED = ("llama", "mistral", "qwen2", "qwen3")  # model_type values of the Llama layout that convert
SUPPORTED_LINE = ("supported: Llama, Mistral, Qwen2 and Qwen3 (model_type 'llama', 'mistral', 'qwen2', "
                  f"'qwen3'); and {SUPPORTED_TAPA_LINE}")
QK_NORM_TYPES = ("qwen3",)  # families whose attention normalizes each query and key head

CONVERT_MARKER = "tapa_convert.json"
CONVERT_FILES = (*MODEL_FILES, *TOKENIZER_FILES, CONVERT_MARKER)  # all that a conversion writes
LAYER_NAMES = {  # Llama name inside model.layers.N -> TapaLM name inside layers.N
    "self_attn.q_proj.weight": "attn.wq.weight",
    "self_attn.k_proj.weight": "attn.wk.weight",
    "self_attn.v_proj.weight": "attn.wv.weight",
    "self_attn.q_proj.bias": "attn.wq.bias",
    "self_attn.k_proj.bias": "attn.wk.bias",
    "self_attn.v_proj.bias": "attn.wv.bias",
    "self_attn.q_norm.weight": "attn.q_norm.weight",
    "self_attn.k_norm.weight": "attn.k_norm.weight",
    "self_attn.o_proj.weight": "attn.wo.weight",
    "mlp.gate_proj.weight": "ffn.w_gate.weight",
    "mlp.up_proj.weight": "ffn.w_up.weight",
    "mlp.down_proj.weight": "ffn.w_down.weight",
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
}
TOP_NAMES = {"model.embed_tokens.weight": "embed.weight", "model.norm.weight": "norm.weight",
             "lm_head.weight": "lm_head.weight"}


def low_frequency_first(head_dim: int) -> torch.Tensor:
    """Head-dim order, pair by pair from the lowest rotary frequency: D/2-1, D-1, D/2-2, D-2, ..., 0, D/2."""
    half = head_dim // 2
    pairs = torch.arange(half - 1, -1, -1)
    return torch.stack([pairs, pairs + half], dim=1).flatten()


def tapa_config_from_llama(llama: dict, *, pe: str, theta: float, alpha: float, distance: str,
                           phase_init_scale: float, layer_pattern: str = "G",
                           local_window: int = 256) -> ModelConfig:
    """The ModelConfig of a converted Llama-layout config (module docstring); ValueError in one
    line for what TAPA's decoder cannot represent. attention_bias is set from the weights
    (`has_qkv_bias`)."""
    model_type = llama.get("model_type")
    if model_type not in SUPPORTED:
        raise ValueError(f"model_type {model_type!r} cannot be converted: expected a Llama config or another "
                         f"Llama-layout family; {SUPPORTED_LINE}")
    heads = llama["num_attention_heads"]
    if llama.get("mlp_bias"):
        raise ValueError("mlp_bias=True: TAPA's decoder has no MLP biases")
    if llama.get("hidden_act", "silu") != "silu":
        raise ValueError(f"hidden_act {llama['hidden_act']!r}: TAPA's decoder uses SiLU (SwiGLU)")
    rope = llama.get("rope_parameters") or llama.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default" and "L" in layer_pattern:
        warnings.warn(f"the checkpoint's RoPE has rope_type {rope_type!r}; local layers use plain RoPE "
                      "(rope_theta, no scaling), so they drop it", stacklevel=3)
    return ModelConfig(
        vocab_size=llama["vocab_size"], dim=llama["hidden_size"], n_layers=llama["num_hidden_layers"],
        n_heads=heads, n_kv_heads=llama.get("num_key_value_heads") or heads, head_dim=llama.get("head_dim"),
        ffn_dim=llama["intermediate_size"], norm_eps=llama.get("rms_norm_eps", 1e-6),
        tie_embeddings=bool(llama.get("tie_word_embeddings", False)),
        init_std=llama.get("initializer_range", 0.02), pe=pe,
        layer_pattern=layer_pattern, local_window=local_window,
        rope_base=float(rope.get("rope_theta", llama.get("rope_theta", 10000.0))),
        original_seq_len=llama.get("max_position_embeddings", 2048),
        qk_norm=model_type in QK_NORM_TYPES,
        **(dict(theta=theta, alpha=alpha, distance=distance)
           if get_kind(pe).family == "tapa" and "G" in layer_pattern else {}),
        phase_init_scale=phase_init_scale)


def read_llama_weights(llama_dir: Path) -> dict[str, torch.Tensor]:
    """All tensors of model.safetensors or of the shards named by model.safetensors.index.json."""
    safe_open = require("safetensors").safe_open
    index = llama_dir / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(read_json(index, "shard index")["weight_map"].values()))
    elif (llama_dir / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        raise ValueError(f"{str(llama_dir)!r} has no model.safetensors (or sharded index); "
                         "re-save the Llama model with save_pretrained(safe_serialization=True)")
    weights = {}
    for name in files:
        with safe_open(str(llama_dir / name), framework="pt") as handle:
            for key in handle.keys():
                weights[key] = handle.get_tensor(key)
    return weights


QK_TENSORS = ("attn.wq.weight", "attn.wk.weight", "attn.wq.bias", "attn.wk.bias",
              "attn.q_norm.weight", "attn.k_norm.weight")
QKV_BIASES = ("q_proj.bias", "k_proj.bias", "v_proj.bias")  # the source's biases the decoder keeps


def has_qkv_bias(weights: dict[str, torch.Tensor]) -> bool:
    """Whether any q/k/v projection bias of a Llama-layout checkpoint is non-zero (all-zero ones,
    as a Llama saved with attention_bias=True may hold, are dropped)."""
    return any(name.endswith(QKV_BIASES) and bool(torch.count_nonzero(t)) for name, t in weights.items())


def tapa_qk(name: str, tensor: torch.Tensor, cfg: ModelConfig) -> torch.Tensor:
    """A TapaLM tensor as the converted model holds it: a global TAPA layer's W_q or W_k, their
    biases and QK-norm weights (each head's rows in the rotate_half RoPE layout) reordered and,
    where the scales go (module docstring), rescaled; any other tensor as it is."""
    parts = name.split(".")
    if not (cfg.family == "tapa" and parts[0] == "layers" and name.endswith(QK_TENSORS)
            and cfg.layer_kind(int(parts[1])) == "global"):
        return tensor
    is_query = name.endswith(("wq.weight", "wq.bias", "q_norm.weight"))
    is_norm = name.endswith("norm.weight")
    heads = 1 if is_norm else cfg.n_heads if is_query else cfg.n_kv_heads
    amp_dim, _ = split_dims(cfg.head_dim, cfg.theta)
    rows = tensor.reshape(heads, cfg.head_dim, -1)[:, low_frequency_first(cfg.head_dim)]  # a copy
    if is_norm == cfg.qk_norm:  # the scales: on the norm weights with QK-norm, else on the rows
        rows[:, amp_dim:] *= cfg.phase_init_scale
        if is_query:
            rows[:, :amp_dim] *= math.sqrt(amp_dim / cfg.head_dim)
    return rows.reshape(tensor.shape)


def llama_to_tapa_state(weights: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Rename every Llama tensor to its TapaLM name; reorder/rescale q and k (module docstring)."""
    state, unused = {}, []
    for name, tensor in weights.items():
        if name.endswith(("q_norm.weight", "k_norm.weight")) and not cfg.qk_norm:
            raise ValueError(f"{name}: QK-norm weights in a checkpoint whose model_type has none; "
                             f"{SUPPORTED_LINE}")
        if name.endswith("_proj.bias") and not (cfg.attention_bias and name.endswith(QKV_BIASES)):
            if torch.count_nonzero(tensor):  # an o_proj or MLP bias: droppable only when all zero
                raise ValueError(f"{name} is not zero: TAPA's decoder has no bias there, so this checkpoint "
                                 "cannot be converted without changing its outputs")
            continue
        if name in TOP_NAMES:
            state[TOP_NAMES[name]] = tensor
            continue
        parts = name.split(".")
        layer_name = ".".join(parts[3:])
        if parts[:2] != ["model", "layers"] or layer_name not in LAYER_NAMES:
            unused.append(name)
            continue
        target = f"layers.{parts[2]}.{LAYER_NAMES[layer_name]}"
        state[target] = tapa_qk(target, tensor, cfg)
    if unused:
        raise ValueError(f"Llama weights with no TAPA counterpart: {unused[:8]}")
    if cfg.tie_embeddings:
        state.pop("lm_head.weight", None)
    return state


def _checked_paths(src_dir: str | Path, out_dir: str | Path, overwrite: bool, src_name: str) -> tuple[Path, Path]:
    """(source, output directory), the output checked by tapa._paths' rule and never the source."""
    src_dir = Path(src_dir).expanduser()
    if Path(out_dir).expanduser().resolve() == src_dir.resolve():
        raise ValueError(f"OUT_DIR must differ from {src_name}: the conversion would overwrite its input")
    return src_dir, check_output_dir(out_dir, outputs=CONVERT_FILES, marker=CONVERT_MARKER,
                                     overwrite=overwrite, command="tapa convert")


def _global_pe(pe: str, phase: str, phase_init_scale: float) -> str:
    """The global layers' kind: for TAPA, the variant of `phase`."""
    if phase_init_scale < 0:
        raise ValueError(f"phase_init_scale must be >= 0, got {phase_init_scale}")
    if get_kind(pe).family == "tapa":
        pe = next((kind.name for kind in KINDS.values() if kind.family == "tapa" and kind.phase == phase), None)
        if pe is None:
            raise ValueError(f"phase must be one of the TAPA phase variants {PHASES}, got {phase!r}")
    return pe


def _generation_ids(model_dir: Path, config: dict) -> tuple[int | None, int | None]:
    """(eos_token_id, pad_token_id) of a transformers directory: its generation config's, else its config's."""
    eos, pad = config.get("eos_token_id"), config.get("pad_token_id")
    generation_file = model_dir / "generation_config.json"
    if generation_file.is_file():
        generation = read_json(generation_file, "generation config")
        eos, pad = generation.get("eos_token_id", eos), generation.get("pad_token_id", pad)
    return eos, pad


def _copy_tokenizer(model_dir: Path, out_dir: Path) -> None:
    for name in TOKENIZER_FILES:
        if (model_dir / name).is_file():
            shutil.copy2(model_dir / name, out_dir / name)


def _record(src_dir: Path, cfg: ModelConfig, model_type: str, *, theta: float, alpha: float, distance: str,
            phase: str, phase_init_scale: float, **extra) -> str:
    """tapa_convert.json: what was converted and how."""
    return json.dumps({
        "from": str(src_dir.resolve()), "model_type": model_type, **extra, "pe": cfg.pe,
        "layer_pattern": cfg.layer_pattern, "local_window": cfg.local_window,
        "local_layers": "the checkpoint's q/k weights, plain RoPE (rope_base) in the window",
        "theta": theta, "alpha": alpha, "distance": distance,
        "phase": phase, "phase_init_scale": phase_init_scale,
        "q_k_row_order": "rotary pairs from lowest to highest frequency",
        "amplitude_q_scale": "sqrt(d_A / head_dim)",
        "scales_on": "q_norm/k_norm weights" if cfg.qk_norm else "q/k rows and their biases"}, indent=2)


def convert_llama(llama_dir: str | Path, out_dir: str | Path, *, theta: float = 0.5, alpha: float = 0.1,
                  distance: str = "power", phase: str = "quadratic", phase_init_scale: float = 1.0,
                  overwrite: bool = False, pe: str = "tapa", layer_pattern: str = "G",
                  local_window: int = 256) -> Path:
    """Convert a local Llama-layout directory (Llama, Mistral, Qwen2, Qwen3); returns out_dir (loadable by
    AutoModelForCausalLM). pe: the global layers' kind ("tapa" takes `phase`; "nope"; a RoPE rule);
    layer_pattern/local_window: a hybrid (module docstring). out_dir follows tapa._paths' rule:
    files of other programs there only with overwrite=True."""
    llama_dir, out_dir = _checked_paths(llama_dir, out_dir, overwrite, "LLAMA_DIR")
    if not (llama_dir / "config.json").is_file():
        raise ValueError(f"{str(llama_dir)!r} is neither a model directory (no config.json) nor a tapa run "
                         "or checkpoint")
    pe = _global_pe(pe, phase, phase_init_scale)
    llama = read_json(llama_dir / "config.json", "model config")
    cfg = tapa_config_from_llama(llama, pe=pe, theta=theta, alpha=alpha, distance=distance,
                                 phase_init_scale=phase_init_scale, layer_pattern=layer_pattern,
                                 local_window=local_window)
    weights = read_llama_weights(llama_dir)
    if has_qkv_bias(weights):
        cfg = dataclasses.replace(cfg, attention_bias=True)
    state = llama_to_tapa_state(weights, cfg)
    eos, pad = _generation_ids(llama_dir, llama)
    with replacing_outputs(out_dir, CONVERT_FILES) as out_dir:
        write_pretrained(out_dir, cfg, state, eos_token_id=eos, pad_token_id=pad, source=str(llama_dir))
        _copy_tokenizer(llama_dir, out_dir)
        (out_dir / CONVERT_MARKER).write_text(_record(
            llama_dir, cfg, llama.get("model_type"), theta=theta, alpha=alpha, distance=distance,
            phase=phase, phase_init_scale=phase_init_scale))
    return out_dir


def _run_tokenizer(source: RopeSource) -> tuple[Path, dict]:
    """The tokenizer.json of a run's token cache and the run's record of it (eot_id, eot_token);
    ValueError in one line saying how to bring a tokenizer when it cannot be found."""
    try:
        path = run_tokenizer(source.run_config)
    except ValueError as err:
        reason = str(err).removesuffix(f"; {_NO_TOKENIZER_HINT}")
        raise ValueError(f"{reason}; the conversion takes the run's tokenizer with it: export the run with "
                         "one (tapa export RUN DIR --tokenizer TOKENIZER) and convert DIR") from err
    return path, source.run_config.get("corpus", {}).get("tokenizer", {})


def convert_tapa_rope(src_dir: str | Path, out_dir: str | Path, *, theta: float = 0.5, alpha: float = 0.1,
                      distance: str = "power", phase: str = "quadratic", phase_init_scale: float = 1.0,
                      overwrite: bool = False, pe: str = "tapa", layer_pattern: str = "G",
                      local_window: int = 256) -> Path:
    """Convert a tapa model whose layers are all global RoPE-family layers (a run, a checkpoint or
    a tapa export: `tapa.hf.rope_source`) as convert_llama converts a Llama: the same flags, the
    same q/k split, the same output directory, with the source's tokenizer. Returns out_dir."""
    src_dir, out_dir = _checked_paths(src_dir, out_dir, overwrite, "SRC_DIR")
    pe = _global_pe(pe, phase, phase_init_scale)
    source = read_rope_source(src_dir)
    cfg = hybrid_config(source.config, pe=pe, theta=theta, alpha=alpha, distance=distance,
                        phase_init_scale=phase_init_scale, layer_pattern=layer_pattern, local_window=local_window)
    state = {name: tapa_qk(name, tensor, cfg) for name, tensor in source.weights.items()}
    if source.run_config is None:  # a tapa export: its own tokenizer and generation files
        tokenizer_json, tokenizer_meta = None, {}
        config = read_json(source.checkpoint / "config.json", "model config")
        eos, pad = _generation_ids(source.checkpoint, config)
    else:
        tokenizer_json, tokenizer_meta = _run_tokenizer(source)
        eos = pad = tokenizer_meta.get("eot_id")
    with replacing_outputs(out_dir, CONVERT_FILES) as out_dir:
        write_pretrained(out_dir, cfg, state, eos_token_id=eos, pad_token_id=pad, source=str(src_dir))
        if tokenizer_json is None:
            _copy_tokenizer(source.checkpoint, out_dir)
        else:
            save_tokenizer(tokenizer_json, out_dir, tokenizer_meta.get("eot_token"))
        (out_dir / CONVERT_MARKER).write_text(_record(
            src_dir, cfg, MODEL_TYPE, theta=theta, alpha=alpha, distance=distance, phase=phase,
            phase_init_scale=phase_init_scale, checkpoint=str(source.checkpoint.resolve()),
            source_pe=source.config.pe))
    return out_dir


def convert_model(src_dir: str | Path, out_dir: str | Path, **options) -> Path:
    """`tapa convert`: a tapa run, checkpoint or export (convert_tapa_rope), else a Llama-layout
    directory (convert_llama); the same options for both."""
    convert = convert_tapa_rope if is_tapa_source(src_dir) else convert_llama
    return convert(src_dir, out_dir, **options)


def add_arguments(parser) -> None:
    parser.add_argument("src_dir", metavar="SRC_DIR",
                        help="a local Llama, Mistral, Qwen2 or Qwen3 model directory (safetensors), or a tapa model "
                             "whose layers are all global RoPE-family layers: a run directory (its latest "
                             "checkpoint), a checkpoint directory, or a tapa export of one")
    parser.add_argument("out_dir", metavar="OUT_DIR", help="TAPA model directory to write")
    parser.add_argument("--layer-pattern", default="G",
                        help="per-layer codes repeated over the layers: L = local (the checkpoint's RoPE "
                             "in a sliding window), G = global (--pe); e.g. LLLG. Default G: all global")
    parser.add_argument("--local-window", type=int, default=256, help="tokens a local layer's query sees (default: %(default)s)")
    parser.add_argument("--pe", default="tapa", choices=[name for name, kind in KINDS.items()
                                                         if kind.family != "tapa" or name == "tapa"],
                        help="global layers: tapa (the TAPA split; --phase picks its variant), nope (no "
                             "rotary), or a RoPE rule (default: %(default)s)")
    parser.add_argument("--theta", type=float, default=0.5, help="amplitude fraction of each head, d_A = theta * D (default: %(default)s)")
    parser.add_argument("--alpha", type=float, default=0.1, help="distance exponent (power) or slope (linear) (default: %(default)s)")
    parser.add_argument("--distance", default="power", choices=["power", "linear"], help="(default: %(default)s)")
    parser.add_argument("--phase", default="quadratic", choices=["quadratic", "linear"],
                        help="(default: %(default)s)")
    parser.add_argument("--phase-init-scale", type=float, default=1.0,
                        help="multiplies the phase rows of W_q and W_k; 0 gives the source's attention "
                             "without rotary (default: %(default)s)")
    parser.add_argument("--overwrite", action="store_true",
                        help="write into OUT_DIR even if it holds files tapa convert did not write")


def run(args) -> int:
    out_dir = convert_model(args.src_dir, args.out_dir, theta=args.theta, alpha=args.alpha,
                            distance=args.distance, phase=args.phase, phase_init_scale=args.phase_init_scale,
                            overwrite=args.overwrite, pe=args.pe, layer_pattern=args.layer_pattern,
                            local_window=args.local_window)
    print(f"converted {args.src_dir} -> {out_dir}")
    return 0
