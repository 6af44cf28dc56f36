"""The model's KV cache: preallocated buffers written at an index (gpt-fast style), no concatenation
per decoding step.

Global layers hold `max_len` slots. Local (sliding-window) layers hold a ring of `local_window`
slots, slot s at ring index s % local_window, so their memory is bounded at any context length.
Buffers are allocated at the first write, in that write's dtype and device (under autocast the
projections come out in bfloat16).

The interface every cache of the model shares (`tapa.hf` wraps transformers' caches in it):
    update(layer, k, v, start) -> (keys, values, key_slots)
        k, v (B, N, Hk, D) are the slots start .. start + N - 1; keys/values are every key the
        layer's queries may need; key_slots is an int (the keys are the consecutive slots
        key_slots, key_slots + 1, ...) or a LongTensor of each key's slot.
    advance(n): n more slots are filled (the model calls it after all layers ran).
"""

from __future__ import annotations

import torch

from tapa.model.config import ModelConfig


def ring_positions(pos, slots, size):
    """The positions whose keys ring slots `slots` of a `size`-slot ring hold once position pos is
    written (negative: none yet). Ints or broadcasting tensors (the decoding step's positions may
    live on the device)."""
    return pos - (pos - slots) % size


class KVCache:
    """Keys and values of the slots seen so far; see the module docstring."""

    def __init__(self, cfg: ModelConfig, batch: int, max_len: int):
        if batch < 1 or max_len < 1:
            raise ValueError(f"batch and max_len must be positive, got batch={batch}, max_len={max_len}")
        self.batch, self.max_len, self.window = batch, max_len, cfg.local_window
        self.local = [cfg.layer_kind(layer) == "local" for layer in range(cfg.n_layers)]
        self.keys: list[torch.Tensor | None] = [None] * cfg.n_layers
        self.values: list[torch.Tensor | None] = [None] * cfg.n_layers
        self.length = 0

    def capacity(self, layer: int) -> int:
        return min(self.window, self.max_len) if self.local[layer] else self.max_len

    def _buffers(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        if self.keys[layer] is None:
            size = self.capacity(layer)
            self.keys[layer] = k.new_zeros(self.batch, size, *k.shape[2:])
            self.values[layer] = v.new_zeros(self.batch, size, *v.shape[2:])
        return self.keys[layer], self.values[layer]

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor, start: int):
        new = k.shape[1]
        if k.shape[0] != self.batch:
            raise ValueError(f"the cache was set up for batch {self.batch}, got {k.shape[0]}")
        if start + new > self.max_len:
            raise ValueError(f"the cache holds max_len={self.max_len} tokens; this call needs {start + new}")
        keys, values = self._buffers(layer, k, v)
        if not self.local[layer]:
            keys[:, start:start + new] = k
            values[:, start:start + new] = v
            return keys[:, :start + new], values[:, :start + new], 0
        size = keys.shape[1]
        if new == 1:  # decoding: write, then every filled ring slot is within the window
            keys[:, start % size] = k[:, 0]
            values[:, start % size] = v[:, 0]
            filled = min(start + 1, size)
            ring = torch.arange(filled, device=k.device)
            return keys[:, :filled], values[:, :filled], ring_positions(start, ring, size)
        # prefill / chunk: the window before `start`, in slot order, then the new keys
        previous = min(start, size - 1)
        ring = torch.arange(start - previous, start, device=k.device) % size
        all_keys = torch.cat([keys[:, ring], k], dim=1)
        all_values = torch.cat([values[:, ring], v], dim=1)
        kept = min(new, size)
        slots = torch.arange(start + new - kept, start + new, device=k.device)
        keys[:, slots % size] = k[:, new - kept:]
        values[:, slots % size] = v[:, new - kept:]
        return all_keys, all_values, start - previous

    def write_at(self, layer: int, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor,
                 rows: torch.Tensor):
        """One token per sequence at positions held on the device, pos (B,) (static shapes: no
        host read, for CUDA graphs; `StaticDecoder`): k, v (B, 1, Hk, D) into their slots (ring
        slots in local layers), given rows = arange(B). Returns the layer's whole key and value
        buffers. The buffers must exist (a prefill allocated them)."""
        keys, values = self.keys[layer], self.values[layer]
        slot = pos % keys.shape[1] if self.local[layer] else pos
        keys[rows, slot] = k[:, 0].to(keys.dtype)
        values[rows, slot] = v[:, 0].to(values.dtype)
        return keys, values

    def advance(self, new: int) -> None:
        self.length += new
