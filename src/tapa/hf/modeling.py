"""`TapaForCausalLM`: a `tapa.model.TapaLM` behind transformers' PreTrainedModel and GenerationMixin.

The decoder is `TapaLM` itself (held as `self.model`, so weights are named `model.<TapaLM name>`);
this class adds what transformers expects: a `Cache` (DynamicCache by default), attention masks
and padding, position ids, `generate()`, save/load through safetensors. Each layer's attention
runs through `tapa.hf.attention.layer_attention`; the norms, FFN and head are TapaLM's modules.

Runs under transformers 5.17 and later: 5.17 names the cache argument `past_key_values`, later
versions `cache`; forward accepts both and returns it under the name the installed version uses.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from tapa._optional import require
from tapa.hf.attention import AttentionContext, layer_attention
from tapa.hf.configuration import TapaConfig, write_remote_code
from tapa.model import TapaLM

transformers = require("transformers")
from transformers import GenerationMixin, PreTrainedModel  # noqa: E402
from transformers.cache_utils import Cache, DynamicCache  # noqa: E402
from transformers.modeling_outputs import CausalLMOutputWithPast  # noqa: E402

_OUTPUT_FIELDS = {field.name for field in dataclasses.fields(CausalLMOutputWithPast)}
CACHE_OUTPUT_NAME = "cache" if "cache" in _OUTPUT_FIELDS else "past_key_values"


def _left_pad(mask: torch.Tensor) -> torch.Tensor | None:
    """(B,) count of leading zeros if every row of the 0/1 mask is zeros then ones, else None."""
    if bool((mask[:, 1:] < mask[:, :-1]).any()):
        return None
    return (mask == 0).sum(-1).to(torch.int32)


def attention_context(attention_mask, position_ids, batch: int, past_len: int, seq_len: int,
                      device, *, family: str) -> AttentionContext:
    """Positions and masks shared by every layer of one forward pass.

    Without padding, positions are the slots 0 .. past_len + seq_len - 1. With padding they
    restart at 0 at each sequence's first real token (cumsum of the mask). `position_ids`, if
    given, rotate the RoPE family; for TAPA they must agree with these positions on real tokens
    (TAPA distances come from the mask); NoPE has no positions.
    """
    total = past_len + seq_len
    if attention_mask is not None:
        if attention_mask.dim() == 4:
            raise ValueError("4D attention masks are not supported: pass the 2D 0/1 mask (batch, cached + new)")
        if attention_mask.dim() != 2 or tuple(attention_mask.shape) != (batch, total):
            raise ValueError(f"attention_mask must be (batch, cached + new tokens) = {(batch, total)}, "
                             f"got {tuple(attention_mask.shape)}")
        if bool(attention_mask.all()):
            attention_mask = None
    if attention_mask is None:
        positions = torch.arange(total, device=device).expand(batch, total)
        key_mask = left_pad = None
    else:
        key_mask = attention_mask.to(device=device, dtype=torch.bool)
        positions = (key_mask.long().cumsum(-1) - 1).clamp(min=0)
        left_pad = _left_pad(key_mask.long())
    rope = family == "rope"
    if position_ids is not None and family != "nope":
        position_ids = position_ids.to(device).expand(batch, seq_len)
        if rope:
            positions = torch.cat([positions[:, :past_len], position_ids], dim=1)
        else:
            real = key_mask[:, past_len:] if key_mask is not None else torch.ones_like(position_ids, dtype=torch.bool)
            if bool((position_ids != positions[:, past_len:])[real].any()):
                raise ValueError("position_ids disagree with the positions implied by attention_mask; "
                                 "TAPA computes distances from the attention mask (positions restart at "
                                 "0 at each sequence's first real token)")
    return AttentionContext(past_len=past_len, positions=positions, key_mask=key_mask, left_pad=left_pad,
                            uniform=key_mask is None and (position_ids is None or not rope))


class TapaForCausalLM(PreTrainedModel, GenerationMixin):
    """Causal LM with TAPA (or a RoPE-family / NoPE baseline) attention; see the module docstring."""

    config_class = TapaConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    _no_split_modules = ["Block"]
    _tied_weights_keys = {"model.lm_head.weight": "model.embed.weight"}
    supports_gradient_checkpointing = False

    def __init__(self, config: TapaConfig):
        super().__init__(config)
        self.model = TapaLM(config.model_config())
        self.post_init()

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
    def from_pretrained(cls, *args, **kwargs):
        """transformers' from_pretrained, but missing, unexpected or mis-shaped weights are a
        ValueError instead of a warning (a TAPA checkpoint never has optional weights)."""
        want_info = kwargs.pop("output_loading_info", False)
        where = args[0] if args else kwargs.get("pretrained_model_name_or_path", "")
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
        if problems:
            raise ValueError(f"checkpoint {where} does not match its config "
                             f"(model_type {cls.config_class.model_type!r}): {problems}")
        return (model, info) if want_info else model

    def save_pretrained(self, save_directory, *args, **kwargs):
        super().save_pretrained(save_directory, *args, **kwargs)
        write_remote_code(save_directory)

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
        ctx = attention_context(attention_mask, position_ids, batch, past_len, seq_len, x.device,
                                family=self.config.model_config().family)
        for layer_idx, block in enumerate(self.model.layers):
            x = x + layer_attention(block.attn, block.attn_norm(x), ctx, cache, layer_idx)
            x = x + block.ffn(block.ffn_norm(x))
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
