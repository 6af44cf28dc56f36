"""`TapaForCausalLM`: a `tapa.model.TapaLM` behind transformers' PreTrainedModel and GenerationMixin.

A thin adapter: the decoder is `TapaLM` itself (held as `self.model`, so weights are named
`model.<TapaLM name>`), and attention, positions and padding are the model's own
(`tapa.model.attention`). This class maps what transformers passes (a `Cache`, a 0/1 attention
mask, position ids, labels) onto it: the cache is wrapped in the model's cache interface.

Runs under transformers 5.17 and later: 5.17 names the cache argument `past_key_values`, later
versions `cache`; forward accepts both and returns it under the name the installed version uses.

transformers conventions:
- `gradient_checkpointing_enable()` / `activation_checkpointing_enable()` set
  `TapaLM.checkpoint_blocks`: each block is recomputed in the backward (torch's non-reentrant
  checkpoint); the disable calls clear it. Checkpoint kwargs (use_reentrant, offload) are not used.
- `attn_implementation` takes "eager" or "sdpa" (the default), and both run the model's own
  attention: TAPA global layers the TAPA op (`tapa.ops.tapa_attention`: the fused Triton kernel on
  CUDA, the reference op elsewhere), RoPE/NoPE global layers and local layers PyTorch's SDPA.
  Any other value (flash_attention_2, flex_attention, a kernel) is a ValueError saying so.
- `generate` is transformers' GenerationMixin.generate: it returns the prompt followed by the new
  tokens, (B, N + new). `TapaLM.generate` (the bare model's fast path) returns the new tokens only,
  (B, new); prepend the prompt (torch.cat([ids, out], 1)) to compare the two.
"""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

from tapa._optional import require
from tapa.hf.configuration import TapaConfig, write_remote_code
from tapa.hf.writer import CHECKSUMS, PREFIX, write_checksums
from tapa.hf.writer import verify_checksums as verify_checksums_of
from tapa.model import AttentionContext, TapaLM, upgrade_state_dict

transformers = require("transformers")
from transformers import GenerationMixin, PreTrainedModel  # noqa: E402
from transformers.cache_utils import Cache, DynamicCache  # noqa: E402
from transformers.modeling_outputs import CausalLMOutputWithPast  # noqa: E402

_OUTPUT_FIELDS = {field.name for field in dataclasses.fields(CausalLMOutputWithPast)}
# outputs transformers can ask forward for that TapaForCausalLM does not produce
UNSUPPORTED_OUTPUTS = ("output_attentions", "output_hidden_states")
# what generate may pass that carries nothing this model needs (positions come from the cache)
IGNORED_INPUTS = ("cache_position",)
CACHE_OUTPUT_NAME = "cache" if "cache" in _OUTPUT_FIELDS else "past_key_values"


class ModelCache:
    """A transformers `Cache` behind the model's cache interface (`tapa.model.cache`): transformers
    holds (B, Hk, len, D) per layer and returns the keys the new tokens may see, oldest first.
    A static cache that is not yet full returns its whole buffer (the filled slots are kept); a
    sliding-window layer (a hybrid's local layers, TapaConfig.layer_types) returns only the last
    tokens, which start at slot start + new - len."""

    def __init__(self, cache: Cache):
        self.cache = cache

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor, start: int):
        keys, values = self.cache.update(k.transpose(1, 2), v.transpose(1, 2), layer)
        total, held = start + k.shape[1], keys.shape[2]
        if held >= total:  # every token from slot 0 (a static buffer: and empty slots after them)
            return keys.transpose(1, 2)[:, :total], values.transpose(1, 2)[:, :total], 0
        return keys.transpose(1, 2), values.transpose(1, 2), total - held

    def advance(self, new: int) -> None:
        """transformers' caches count their own length."""


def _before_phase_split(info: dict) -> bool:
    """Whether the only loading problems are those of a model saved before TAPA's phase rows of
    W_q/W_k became parameters of their own (one wq/wk holding every row)."""
    missing = set(info.get("missing_keys", ()))
    mismatched = {name for name, _, _ in info.get("mismatched_keys", ())}
    return bool(missing) and all(name.endswith(("wq_phase.weight", "wk_phase.weight", "wq_phase.bias",
                                                "wk_phase.bias")) for name in missing) \
        and all(name.endswith(("attn.wq.weight", "attn.wk.weight", "attn.wq.bias", "attn.wk.bias"))
                for name in mismatched)


def _load_split_phase_rows(model: "TapaForCausalLM", where) -> bool:
    """Load a local directory's weights of the earlier layout into `model`; False if not local."""
    from pathlib import Path

    files = sorted(Path(str(where)).glob("*.safetensors")) if Path(str(where)).is_dir() else []
    if not files:
        return False
    load_file = require("safetensors.torch").load_file
    state = {}
    for path in files:
        state.update({name.removeprefix(PREFIX): tensor for name, tensor in load_file(str(path)).items()})
    lm = model.model
    state = upgrade_state_dict(state, lm.config)
    if lm.config.tie_embeddings:
        state.setdefault("lm_head.weight", state["embed.weight"])
    dtype = next(lm.parameters()).dtype
    lm.load_state_dict({name: tensor.to(dtype) for name, tensor in state.items()})
    return True


class TapaForCausalLM(PreTrainedModel, GenerationMixin):
    """Causal LM with TAPA (or a RoPE-family / NoPE baseline) attention; see the module docstring."""

    config_class = TapaConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    _no_split_modules = ["Block"]
    _tied_weights_keys = {"model.lm_head.weight": "model.embed.weight"}
    supports_gradient_checkpointing = True  # TapaLM.checkpoint_blocks (_set_gradient_checkpointing)
    _supports_sdpa = True

    def __init__(self, config: TapaConfig):
        super().__init__(config)
        self.model = TapaLM(config.model_config())
        self.post_init()

    def _set_gradient_checkpointing(self, enable: bool = True, gradient_checkpointing_func=None,
                                    every_n_layers: int = 1):
        """What gradient_checkpointing_enable/disable end in: TapaLM.checkpoint_blocks (every block
        recomputed in the backward, torch's non-reentrant checkpoint)."""
        if enable and every_n_layers != 1:
            raise ValueError(f"TapaForCausalLM checkpoints every block; every_n_layers={every_n_layers} "
                             "is not supported")
        self.model.checkpoint_blocks = bool(enable)

    @property
    def is_activation_checkpointing(self) -> bool:
        return bool(self.model.checkpoint_blocks)

    @property
    def is_gradient_checkpointing(self) -> bool:
        return bool(self.model.checkpoint_blocks)

    def _check_and_adjust_attn_implementation(self, attn_implementation=None, is_init_check: bool = False,
                                              *args, **kwargs) -> str:
        """'eager' or 'sdpa' (None: 'sdpa'); both run the model's own attention (module docstring)."""
        return check_attn_implementation(attn_implementation)

    def _init_weights(self, module):
        """TapaLM initializes itself (phase_init_scale etc.); transformers' default init must not."""

    def get_input_embeddings(self):
        return self.model.embed

    def set_input_embeddings(self, value):
        self.model.embed = value

    def get_output_embeddings(self):
        return self.model.lm_head

    def set_output_embeddings(self, value):
        self.model.lm_head = value

    @classmethod
    def from_tapa_lm(cls, lm: TapaLM) -> "TapaForCausalLM":
        """Wrap a trained TapaLM's weights (copied exactly) in a transformers model."""
        model = cls(TapaConfig.from_model_config(lm.config))
        model.model.load_state_dict(lm.state_dict())
        return model.to(next(lm.parameters()).dtype)

    @classmethod
    def from_pretrained(cls, *args, verify_checksums: bool = True, **kwargs):
        """transformers' from_pretrained, but missing, unexpected or mis-shaped weights are a
        ValueError instead of a warning (a TAPA checkpoint never has optional weights), and so are
        weight files of a local directory that do not match the sha256 its tapa_checksums.json
        (written by tapa export / convert / save_pretrained) records; verify_checksums=False skips
        that check."""
        want_info = kwargs.pop("output_loading_info", False)
        where = args[0] if args else kwargs.get("pretrained_model_name_or_path", "")
        local = Path(str(where), kwargs.get("subfolder") or "")
        if verify_checksums and local.is_dir():
            verify_checksums_of(local)
        try:
            model, info = super().from_pretrained(*args, output_loading_info=True, **kwargs)
        except RuntimeError as err:  # transformers refuses mis-shaped weights: load again to list them
            if "mismatch" not in str(err):
                raise
            kwargs["ignore_mismatched_sizes"] = True
            model, info = super().from_pretrained(*args, output_loading_info=True, **kwargs)
        tied = set(cls._tied_weights_keys) if model.config.tie_embeddings else set()
        problems = {
            "missing": sorted(set(info.get("missing_keys", ())) - tied),
            "unexpected": sorted(info.get("unexpected_keys", ())),
            "mismatched": [f"{name}: checkpoint {tuple(saved)} vs config {tuple(expected)}"
                           for name, saved, expected in info.get("mismatched_keys", ())],
        }
        problems = {kind: names for kind, names in problems.items() if names}
        if problems and _before_phase_split(info) and _load_split_phase_rows(model, where):
            problems = {}
        if problems:
            raise ValueError(f"checkpoint {where} does not match its config "
                             f"(model_type {cls.config_class.model_type!r}): {problems}")
        return (model, info) if want_info else model

    def save_pretrained(self, save_directory, *args, **kwargs):
        super().save_pretrained(save_directory, *args, **kwargs)
        write_remote_code(save_directory)
        if any(Path(save_directory).glob("*.safetensors")):  # never a stale tapa_checksums.json
            write_checksums(save_directory)
        else:
            (Path(save_directory) / CHECKSUMS).unlink(missing_ok=True)

    def create_masks_for_generate(self, config=None, inputs_embeds=None, attention_mask=None, **kwargs):
        """generate's hook for static caches: keep its 2D 0/1 mask (the attention builds its own)."""
        return attention_mask

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        past_key_values: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        cache: Cache | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ):
        """Logits (B, N, vocab) for input_ids (B, N) after the cached tokens.

        attention_mask (B, cached + N) of 0/1 marks padding; labels (B, N) give the next-token
        loss (shifted inside, -100 ignored). `cache` (or `past_key_values`) is a transformers
        Cache; with use_cache (the default outside training) a DynamicCache is created.
        """
        _check_forward_kwargs(kwargs)
        if past_key_values is not None and cache is not None:
            raise ValueError("pass the cache as `cache` or `past_key_values`, not both")
        cache = cache if cache is not None else past_key_values
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids and inputs_embeds")
        x = self.model.embed(input_ids) if inputs_embeds is None else inputs_embeds
        if x.dim() != 3:
            raise ValueError(f"input_ids must be (batch, seqlen), got shape {tuple(x.shape[:-1])}")
        if use_cache is None:
            use_cache = not self.training
        if use_cache and cache is None:
            cache = DynamicCache(config=self.config)
        past_len = int(cache.get_seq_length()) if cache is not None else 0  # a tensor for static caches
        batch, seq_len, _ = x.shape
        ctx = AttentionContext.build(batch, past_len, seq_len, x.device, attention_mask=attention_mask,
                                     position_ids=position_ids, cfg=self.model.config)
        x = self.model.blocks(x, ctx, ModelCache(cache) if cache is not None else None)
        if isinstance(logits_to_keep, int) and logits_to_keep > 0:
            x = x[:, -logits_to_keep:]
        elif isinstance(logits_to_keep, torch.Tensor):
            x = x[:, logits_to_keep]
        logits = self.model.lm_head(self.model.norm(x))
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].float().flatten(0, 1), labels[:, 1:].flatten(),
                                   ignore_index=-100)
        return CausalLMOutputWithPast(loss=loss, logits=logits,
                                      **{CACHE_OUTPUT_NAME: cache if use_cache else None})


ATTN_IMPLEMENTATIONS = ("eager", "sdpa")
ATTN_NOTE = ("TAPA layers use the TAPA op (the fused Triton kernel on CUDA), RoPE/NoPE global and local "
             "layers PyTorch's SDPA, whatever attn_implementation says")


def check_attn_implementation(value: str | None) -> str:
    """A transformers attn_implementation this model accepts ('eager' or 'sdpa'; None: 'sdpa');
    ValueError in one line for any other (flash_attention_2, flex_attention, a hub kernel)."""
    if value is None:
        return "sdpa"
    if isinstance(value, str) and value.removeprefix("paged|") in ATTN_IMPLEMENTATIONS:
        return value.removeprefix("paged|")
    raise ValueError(f"TapaForCausalLM takes attn_implementation 'eager' or 'sdpa', got {value!r}: {ATTN_NOTE}")


def _check_forward_kwargs(kwargs: dict) -> None:
    """forward takes **kwargs because generate and Trainer pass extra arguments; none of them may be
    silently ignored when it asks for something: an output this model does not produce is a
    ValueError, any other unknown argument (a misspelt attention_mask) a warning."""
    asked = [name for name in UNSUPPORTED_OUTPUTS if kwargs.get(name)]
    if asked:
        raise ValueError(f"TapaForCausalLM does not return attentions or hidden states; "
                         f"got {', '.join(f'{name}=True' for name in asked)}")
    unknown = sorted(set(kwargs) - set(UNSUPPORTED_OUTPUTS) - set(IGNORED_INPUTS))
    if unknown:
        warnings.warn(f"TapaForCausalLM.forward ignores the arguments {unknown}", stacklevel=3)
