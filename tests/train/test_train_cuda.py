"""The trainer on one GPU: bf16 autocast, the fused kernel through attn_impl="auto", FSDP2 at world
size 1 against the plain model, and resume. Skipped without CUDA (run: pytest -m cuda tests/train)."""

import json
import shutil

import pytest
import torch
from trainkit import losses, records, small_configs

from tapa.train.trainer import train

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

# bf16 matmuls and a non-deterministic kernel order: curves agree to bf16 noise, not bit for bit
BF16_TOLERANCE = 2e-2
GPU_MODEL = dict(dim=256, n_layers=2, n_heads=2)  # head_dim 128, the fused kernel's main case


def _gpu_configs(run_dir, cache_dir, **train):
    values = dict(seq_len=256, batch_size=8, steps=8, save_every=4, eval_every=4, device="cuda")
    values.update(train)
    return small_configs(run_dir, cache_dir, model=GPU_MODEL, **values)


def _close(a, b):
    return len(a) == len(b) and max(abs(x - y) for x, y in zip(a, b)) <= BF16_TOLERANCE


def test_gpu_plain_fsdp_and_resume(cache_dir, tmp_path):
    plain = tmp_path / "plain"
    train(*_gpu_configs(plain, cache_dir))
    assert records(plain)[-1]["loss"] < records(plain)[0]["loss"]
    config = json.loads((plain / "config.json").read_text())
    assert config["precision"] == "bf16" and config["device"].startswith("cuda")

    sharded = tmp_path / "fsdp"
    train(*_gpu_configs(sharded, cache_dir, parallel="fsdp", stop_after=4))
    resumed = tmp_path / "fsdp-resumed"
    shutil.copytree(sharded, resumed)
    train(*_gpu_configs(resumed, cache_dir, parallel="fsdp", resume=True))
    assert _close(losses(resumed), losses(plain)), (losses(resumed), losses(plain))

    # the same checkpoint also resumes without FSDP
    unsharded = tmp_path / "resumed-plain"
    shutil.copytree(sharded, unsharded)
    train(*_gpu_configs(unsharded, cache_dir, parallel="none", resume=True))
    assert _close(losses(unsharded), losses(plain)), (losses(unsharded), losses(plain))


def test_gpu_hybrid_fsdp_and_resume(cache_dir, tmp_path):
    """The TAPA hybrid (local sliding-window RoPE layers on FlexAttention, a global TAPA layer) with
    its phase parameters at phase_lr_scale: FSDP2 and a resume follow the plain run."""
    hybrid = dict(GPU_MODEL, n_layers=4, layer_pattern="LLLG", local_window=64)
    plain = tmp_path / "hybrid"
    train(*small_configs(plain, cache_dir, model=hybrid, seq_len=256, batch_size=8, steps=8,
                         save_every=4, eval_every=4, device="cuda", phase_lr_scale=0.3))
    assert records(plain)[-1]["loss"] < records(plain)[0]["loss"]
    sharded = tmp_path / "hybrid-fsdp"
    configs = dict(model=hybrid, seq_len=256, batch_size=8, steps=8, save_every=4, eval_every=4,
                   device="cuda", phase_lr_scale=0.3, parallel="fsdp")
    train(*small_configs(sharded, cache_dir, stop_after=4, **configs))
    train(*small_configs(sharded, cache_dir, resume=True, **configs))
    assert _close(losses(sharded), losses(plain)), (losses(sharded), losses(plain))
