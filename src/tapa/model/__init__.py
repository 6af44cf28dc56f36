"""The model: typed config, one attention module for every layer kind, KV cache, LLaMA-style decoder,
static-shape decoding steps (CUDA graphs)."""

from tapa.model.attention import Attention, AttentionContext, Documents, is_phase_parameter, upgrade_state_dict
from tapa.model.cache import KVCache
from tapa.model.config import PE_CHOICES, PHASE_MATRICES, ModelConfig
from tapa.model.decoder import SwiGLU, TapaLM
from tapa.model.norm import RMSNorm
from tapa.model.static_decode import StaticDecoder

__all__ = ["ModelConfig", "TapaLM", "KVCache", "StaticDecoder", "Attention", "AttentionContext", "Documents", "RMSNorm", "SwiGLU",
           "PE_CHOICES", "PHASE_MATRICES", "is_phase_parameter", "upgrade_state_dict"]
