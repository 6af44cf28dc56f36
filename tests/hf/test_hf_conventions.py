"""transformers conventions of TapaForCausalLM (issue 38): gradient checkpointing,
attn_implementation, generate's return."""

from __future__ import annotations

import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")
from transformers import AutoModelForCausalLM  # noqa: E402

from tapa.hf import TapaConfig, TapaForCausalLM  # noqa: E402


def tiny(pattern="LG", pe="tapa"):
    torch.manual_seed(0)
    config = TapaConfig(vocab_size=61, dim=32, n_layers=2, n_heads=2, pe=pe, layer_pattern=pattern,
                        local_window=8, attn_impl="reference")
    return TapaForCausalLM(config)


@pytest.mark.parametrize("pe", ["tapa", "rope"])
def test_gradient_checkpointing_gives_the_same_loss_and_gradients(pe, monkeypatch):
    from tapa.model import decoder

    model = tiny(pe=pe).train()
    ids = torch.randint(0, 61, (2, 20), generator=torch.Generator().manual_seed(1))

    def loss_and_grads():
        model.zero_grad()
        loss = model(ids, labels=ids).loss
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    plain_loss, plain = loss_and_grads()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # transformers 5.25 renames it activation_checkpointing_*
        model.gradient_checkpointing_enable()
    assert model.model.checkpoint_blocks and model.is_activation_checkpointing
    calls, forward = [], decoder.Block.forward
    monkeypatch.setattr(decoder.Block, "forward", lambda self, *a, **k: calls.append(1) or forward(self, *a, **k))
    ckpt_loss, ckpt = loss_and_grads()
    monkeypatch.undo()
    assert len(calls) == 4  # each of the 2 blocks ran again in the backward: recomputed
    torch.testing.assert_close(ckpt_loss, plain_loss, rtol=0, atol=0)
    for name, grad in plain.items():
        torch.testing.assert_close(ckpt[name], grad, rtol=1e-6, atol=1e-7, msg=name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        model.gradient_checkpointing_disable()
    assert not model.model.checkpoint_blocks


def test_attn_implementation_eager_and_sdpa_accepted_others_one_line(tmp_path):
    model = tiny()
    model.save_pretrained(tmp_path)
    ids = torch.randint(0, 61, (1, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected = model.eval()(ids).logits
    for value in ("eager", "sdpa", None):
        loaded = AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation=value).eval()
        with torch.no_grad():
            torch.testing.assert_close(loaded(ids).logits, expected)
    for value in ("flash_attention_2", "flex_attention"):
        with pytest.raises(ValueError, match=r"^TapaForCausalLM takes attn_implementation 'eager' or 'sdpa', "
                                             r"got '\w+': TAPA layers use the TAPA op[^\n]*$"):
            AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation=value)


def test_generate_returns_prompt_then_new_tokens_and_tapa_lm_the_new_ones():
    model = tiny().eval()
    ids = torch.randint(3, 61, (1, 5), generator=torch.Generator().manual_seed(3))
    hf = model.generate(ids, max_new_tokens=6, do_sample=False)
    bare = model.model.generate(ids, max_new_tokens=6)
    assert hf.shape == (1, 11) and bare.shape == (1, 6)
    assert torch.equal(hf, torch.cat([ids, bare], dim=1))
