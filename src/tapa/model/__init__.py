"""The model: typed config, attention with pluggable positional encoding, LLaMA-style decoder."""

from tapa.model.config import PE_CHOICES, PHASE_MATRICES, ModelConfig
from tapa.model.decoder import Attention, KVCache, RMSNorm, SwiGLU, TapaLM

__all__ = ["ModelConfig", "TapaLM", "KVCache", "Attention", "RMSNorm", "SwiGLU", "PE_CHOICES",
           "PHASE_MATRICES"]
