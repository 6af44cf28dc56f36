"""Models exported before TAPA's phase rows became their own parameters still load, exactly."""

import torch

from helpers import earlier_phase_layout

from tapa.hf import TapaForCausalLM
from tapa.model import ModelConfig, TapaLM


def test_export_of_the_earlier_layout_loads_with_identical_logits(tmp_path):
    from safetensors.torch import load_file, save_file

    cfg = ModelConfig(vocab_size=97, dim=64, n_layers=2, n_heads=4, n_kv_heads=2)
    torch.manual_seed(0)
    lm = TapaLM(cfg).eval()
    TapaForCausalLM.from_tapa_lm(lm).save_pretrained(tmp_path)
    weights = load_file(str(tmp_path / "model.safetensors"))
    old = earlier_phase_layout(lm, weights)
    assert any(t.shape[0] == 64 for n, t in old.items() if n.endswith("wq.weight"))
    save_file(old, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    (tmp_path / "tapa_checksums.json").unlink()  # written after that layout (and now stale)
    loaded = TapaForCausalLM.from_pretrained(tmp_path).eval()
    ids = torch.randint(0, 97, (2, 11))
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, lm(ids), atol=0, rtol=0)
