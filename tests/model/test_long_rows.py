"""Long rows in less memory: the chunked loss and activation checkpointing change no number."""

import pytest
import torch
import torch.nn.functional as F

from tapa.model import ModelConfig, TapaLM
from tapa.model.decoder import chunked_cross_entropy


def _model():
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=97, dim=32, n_layers=4, n_heads=2, pe="tapa", layer_pattern="LLLG",
                      local_window=8, init_std=0.2)
    return TapaLM(cfg).double()


def _loss_and_grads(model, ids, targets, **settings):
    for name, value in settings.items():
        setattr(model, name, value)
    model.zero_grad()
    loss = model(ids, targets=targets)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("chunk", [1, 7, 64, 10_000])
def test_chunked_cross_entropy_equals_the_full_one(chunk):
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(3, 21, 16, generator=gen, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(50, 16, generator=gen, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 50, (3, 21), generator=gen)
    targets[0, :5] = -100
    full = F.cross_entropy((hidden @ weight.T).flatten(0, 1), targets.flatten(), ignore_index=-100)
    want = torch.autograd.grad(full, (hidden, weight))
    got_loss = chunked_cross_entropy(hidden, weight, targets, chunk)
    got = torch.autograd.grad(got_loss, (hidden, weight))
    assert abs(float(got_loss.detach() - full.detach())) < 1e-12
    for a, b in zip(got, want):
        assert float((a - b).norm() / b.norm()) < 1e-12


def test_targets_give_the_loss_of_the_logits_and_checkpointing_the_same_gradients():
    model = _model()
    ids = torch.randint(0, 97, (2, 40), generator=torch.Generator().manual_seed(1))
    targets = ids.roll(-1, 1)
    with torch.no_grad():
        logits = model(ids)
        assert abs(float(model(ids, targets=targets)
                         - F.cross_entropy(logits.flatten(0, 1), targets.flatten()))) < 1e-12
    base_loss, base = _loss_and_grads(model, ids, targets)
    loss, grads = _loss_and_grads(model, ids, targets, checkpoint_blocks=True, loss_chunk_tokens=9)
    assert abs(float(loss - base_loss)) < 1e-12
    for a, b in zip(grads, base):
        assert float((a - b).norm() / b.norm().clamp_min(1e-300)) < 1e-10
