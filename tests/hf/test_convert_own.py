"""`tapa convert` of tapa's own RoPE models (issue 38's experiment): a tiny `tapa train --pe rope`
run, given as its run directory, a checkpoint or its export, becomes the same LLLG hybrids as a
Llama does; it trains on (--init-from) and evaluates. What must hold, in float64:

- each local layer's attention logits inside the window are the source layer's;
- on a sequence shorter than the window the whole converted model is the source with its global
  layer changed as --pe says, and nothing else: --pe rope, the source itself; --pe nope, the
  source with that layer's rotary removed; --pe tapa at phase scale 0, the source with that layer's
  rotary removed and q.k taken over the lowest-frequency rotary pairs (the amplitude band);
- at phase scale 1 the TAPA global's amplitude logit is the source's q.k / sqrt(D) over that band
  and its phase q_P.k_P the source's q.k over the other pairs; every other weight is unchanged.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sysconfig
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from tapa.cli import main as tapa_main  # noqa: E402
from tapa.hf.export import run_tokenizer  # noqa: E402
from tapa.hf.writer import write_pretrained  # noqa: E402
from tapa.model import ModelConfig, TapaLM  # noqa: E402
from tapa.model.attention import AttentionContext  # noqa: E402
from tapa.model.loading import load_model  # noqa: E402
from tapa.ops import split_dims  # noqa: E402
from tapa.positional.rope import rope_inv_freq  # noqa: E402
from tapa.train import saving  # noqa: E402
from tapa.train.distributed import DistInfo  # noqa: E402

WINDOW, GLOBAL = 16, 3  # LLLG over 4 layers: layers 0-2 local, layer 3 global
TRAIN_FLAGS = ["--seq-len", "32", "--batch-size", "2", "--warmup-steps", "1", "--eval-every", "2",
               "--eval-batches", "1", "--save-every", "2", "--log-every", "1", "--device", "cpu",
               "--no-progress", "--no-plot"]
EVAL_FLAGS = ["--lengths", "32", "--max-tokens", "128", "--stride", "32", "--device", "cpu", "--no-progress"]


@pytest.fixture(scope="module", params=[[], ["--attention-bias", "--qk-norm"]], ids=["plain", "bias-qk-norm"])
def rope_run(tmp_path_factory, request):
    """(run directory of a tiny `tapa train --pe rope`, its text), plain or with Qwen2's q/k/v
    biases and Qwen3's QK-norm; TAPA_CACHE holds its token cache for the whole module (the
    conversion takes the run's tokenizer from it)."""
    root = tmp_path_factory.mktemp("own")
    text = root / "text"
    text.mkdir()
    for i, path in enumerate(sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:12]):
        (text / f"doc{i}.txt").write_text(path.read_text(errors="replace"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TAPA_CACHE", str(root / "cache"))
        run = root / "run"
        assert tapa_main(["train", "--pe", "rope", "--n-layers", "4", "--dim", "64", "--n-heads", "4",
                          "--n-kv-heads", "2", "--init-std", "0.1", "--data", str(text), "--vocab-size", "300",
                          "--run-dir", str(run), "--steps", "2", *request.param, *TRAIN_FLAGS]) == 0
        yield run, text


def exact(cfg: ModelConfig) -> float:
    """The float64 tolerance of "the same logits": RMSNorm runs in float32 (as transformers'
    does), so with QK-norm, whose sums a converted TAPA layer takes over its dims in another
    order, only to float32's precision."""
    return 1e-6 if cfg.qk_norm else 1e-10


def convert(source: Path, out: Path, *flags: str) -> TapaLM:
    assert tapa_main(["convert", str(source), str(out), "--layer-pattern", "LLLG", "--local-window",
                      str(WINDOW), *flags]) == 0
    return load_model(out)[0].double()


def dot(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """q.k (B, H, Nq, Nk) of q (B, Nq, H, d) and GQA keys k (B, Nk, Hk, d)."""
    return torch.einsum("bqhd,bkhd->bhqk", q, k.repeat_interleave(q.shape[2] // k.shape[2], dim=2))


def logits_of(attn, x, local: bool):
    """q.k / sqrt(D) (B, H, N, N) of an attention module on x, after its layer kind's rotation."""
    cfg = attn.cfg
    q, k, _ = attn.project(x)
    ctx = AttentionContext.build(x.shape[0], 0, x.shape[1], x.device, cfg=cfg)
    return dot(ctx.rotate(q, cfg, local), ctx.rotate(k, cfg, local)) / math.sqrt(cfg.head_dim)


def low_frequency_pairs(cfg: ModelConfig, n_dims: int) -> torch.Tensor:
    """The head dims of the n_dims / 2 rotary pairs (i, i + D/2) that rotate slowest."""
    half = cfg.head_dim // 2
    pairs = rope_inv_freq(cfg.head_dim, cfg.rope_base).argsort()[:n_dims // 2]
    return torch.cat([pairs, pairs + half])


@torch.no_grad()
def source_without_rotary(model: TapaLM, ids: torch.Tensor, dims: torch.Tensor) -> torch.Tensor:
    """The source model's logits, except that its layer GLOBAL attends without rotary, with q.k
    over the head dims `dims` only (scaled by 1/sqrt(D), as the source scales)."""
    cfg = model.config
    ctx = AttentionContext.build(ids.shape[0], 0, ids.shape[1], ids.device, cfg=cfg)
    x = model.embed(ids)
    causal = torch.ones(ids.shape[1], ids.shape[1], dtype=torch.bool).tril()
    for i, block in enumerate(model.layers):
        if i != GLOBAL:
            x = block(x, ctx)
            continue
        q, k, v = block.attn.project(block.attn_norm(x))
        v = v.repeat_interleave(cfg.n_heads // cfg.n_kv_heads, dim=2)
        scores = dot(q[..., dims], k[..., dims]) / math.sqrt(cfg.head_dim)
        probs = scores.masked_fill(~causal, float("-inf")).softmax(-1)
        out = torch.einsum("bhqk,bkhd->bqhd", probs, v).reshape(*ids.shape, -1)
        x = x + block.attn.wo(out)
        x = x + block.ffn(block.ffn_norm(x))
    return model.lm_head(model.norm(x))


def test_local_layers_keep_the_source_logits_and_the_tapa_split_takes_the_low_frequency_band(rope_run, tmp_path):
    run, _ = rope_run
    source = load_model(run)[0].double()
    converted = convert(run, tmp_path / "tapa", "--pe", "tapa")
    cfg = converted.config
    assert (cfg.pe, cfg.layer_pattern, cfg.local_window, cfg.phase_init_scale) == ("tapa", "LLLG", WINDOW, 1.0)
    x = torch.randn(2, 2 * WINDOW, cfg.dim, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    distance = torch.arange(2 * WINDOW)[:, None] - torch.arange(2 * WINDOW)[None, :]
    inside = (distance >= 0) & (distance < WINDOW)
    with torch.no_grad():
        for layer in range(GLOBAL):  # local layers: the source's logits at every distance the window holds
            ours = logits_of(converted.layers[layer].attn, x, local=True)
            theirs = logits_of(source.layers[layer].attn, x, local=False)
            torch.testing.assert_close(ours[..., inside], theirs[..., inside], rtol=1e-10, atol=1e-10)
        # the TAPA global: amplitude logit = the source's q.k / sqrt(D) over the slowest pairs,
        # phase q_P.k_P = the source's q.k over the others (phase scale 1)
        ours, theirs = converted.layers[GLOBAL].attn, source.layers[GLOBAL].attn
        amp_dim, _ = split_dims(cfg.head_dim, cfg.theta)
        band = low_frequency_pairs(cfg, amp_dim)
        rest = torch.tensor([d for d in range(cfg.head_dim) if d not in band.tolist()])
        (q, k, _), (sq, sk, _) = ours.project(x), theirs.project(x)
        amplitude = dot(q[..., :amp_dim], k[..., :amp_dim]) / math.sqrt(amp_dim)
        expected = dot(sq[..., band], sk[..., band]) / math.sqrt(cfg.head_dim)
        # W_q's amplitude rows were multiplied by sqrt(d_A / D) = sqrt(1/2) in float32
        torch.testing.assert_close(amplitude, expected, rtol=1e-6, atol=1e-6)
        phase = dot(q[..., amp_dim:], k[..., amp_dim:])
        torch.testing.assert_close(phase, dot(sq[..., rest], sk[..., rest]), rtol=exact(cfg), atol=exact(cfg))
    source_state, state = source.state_dict(), converted.state_dict()
    split = {f"layers.{GLOBAL}.attn.{name}" for name in ("wq.weight", "wk.weight", "wq_phase.weight",
                                                        "wk_phase.weight", "wq.bias", "wk.bias", "wq_phase.bias",
                                                        "wk_phase.bias", "q_norm.weight", "k_norm.weight")}
    assert set(state) - split == set(source_state) - split
    for name in set(state) - split:  # every other weight as it was, the local layers' q/k included
        assert torch.equal(state[name], source_state[name]), name


@pytest.mark.parametrize("pe", ["rope", "nope", "tapa"])
def test_inside_the_window_the_converted_model_is_the_source_with_its_global_layer_changed(rope_run, tmp_path, pe):
    run, _ = rope_run
    source = load_model(run)[0].double()
    flags = ["--pe", pe] + (["--phase-init-scale", "0", "--theta", "0.25"] if pe == "tapa" else [])
    converted = convert(run, tmp_path / pe, *flags)  # theta 0.25: sqrt(d_A / D) = 1/2 scales exactly
    ids = torch.randint(0, source.config.vocab_size, (2, WINDOW - 4), generator=torch.Generator().manual_seed(1))
    head_dim = source.config.head_dim
    band = low_frequency_pairs(source.config, split_dims(head_dim, 0.25)[0])
    with torch.no_grad():
        actual = converted(ids)
        expected = {"rope": lambda: source(ids),
                    "nope": lambda: source_without_rotary(source, ids, torch.arange(head_dim)),
                    "tapa": lambda: source_without_rotary(source, ids, band)}[pe]()
    tolerance = exact(source.config) if pe == "tapa" else 1e-10
    torch.testing.assert_close(actual, expected, rtol=tolerance, atol=tolerance)
    if pe == "tapa":  # the check can fail: the fastest pairs give other logits
        fastest = torch.cat([torch.arange(2), torch.arange(2) + head_dim // 2])
        assert not torch.allclose(actual, source_without_rotary(source, ids, fastest), atol=1e-6)
    if pe == "nope":
        assert not torch.allclose(actual, source(ids), atol=1e-6)


def test_run_checkpoint_and_export_convert_alike_with_the_tokenizer(rope_run, tmp_path):
    run, _ = rope_run
    exported = tmp_path / "exported"
    assert tapa_main(["export", str(run), str(exported)]) == 0
    checkpoint = run / "checkpoints" / (run / "checkpoints" / "latest").read_text().strip()
    outputs = [tmp_path / name for name in ("from-run", "from-checkpoint", "from-export")]
    for source, out in zip((run, checkpoint, exported), outputs):
        convert(source, out, "--pe", "nope")
    for out in outputs:
        for name in ("model.safetensors", "tokenizer.json", "generation_config.json"):
            assert (out / name).read_bytes() == (outputs[0] / name).read_bytes(), (out, name)
    assert json.loads((outputs[0] / "generation_config.json").read_text())["eos_token_id"] is not None
    record = json.loads((outputs[0] / "tapa_convert.json").read_text())
    assert (record["from"], record["source_pe"], record["pe"]) == (str(run.resolve()), "rope", "nope")


def test_converted_run_trains_on_evaluates_and_exports(rope_run, tmp_path, capsys):
    """The retrofit's commands on the converted run: train --init-from, eval (the converted
    directory and the continued run), export."""
    run, text = rope_run
    hybrid, continued, exported = tmp_path / "hybrid", tmp_path / "continued", tmp_path / "exported"
    convert(run, hybrid, "--pe", "tapa")
    cache = Path(os.environ["TAPA_CACHE"]) / "data"
    entries = sorted(path.name for path in cache.iterdir() if not path.name.startswith("."))
    # the run's own tokenizer.json, byte for byte, so that the token cache knows it by its sha256
    assert (hybrid / "tokenizer.json").read_bytes() == run_tokenizer(load_model(run)[2]).read_bytes()
    assert tapa_main(["train", "--init-from", str(hybrid), "--data", str(text), "--run-dir", str(continued),
                      "--steps", "2", *TRAIN_FLAGS]) == 0
    # the continued run reads the source run's cached tokens: nothing was tokenized again
    assert sorted(path.name for path in cache.iterdir() if not path.name.startswith(".")) == entries
    saved = json.loads((continued / "config.json").read_text())
    model, init_from = saved["model"], saved["init_from"]
    assert (model["pe"], model["layer_pattern"], init_from) == ("tapa", "LLLG", str(hybrid))
    digests = set()
    for directory, zero_shot in ((hybrid, True), (continued, False)):
        assert tapa_main(["eval", str(directory), "--data", str(text), *EVAL_FLAGS]) == 0
        results = json.loads((directory / f"eval-{text.name}" / "results.json").read_text())
        assert results["methods"][0]["perplexity"][0]["length"] == 32
        # 1x is the source run's training length, 32 (not the config's original_seq_len, 2048)
        assert results["methods"][0]["train_len"] == 32
        # a conversion trains nothing: its stage is zero-shot; the continued run's is continual
        assert results["methods"][0]["zero_shot"] is zero_shot
        digests.add(results["data"]["token_sha256"])
    assert len(digests) == 1  # the same ids scored: tapa report calls it one text
    assert tapa_main(["export", str(continued), str(exported)]) == 0
    assert "TAPA hybrid (LLLG, w16)" in capsys.readouterr().out


def save_run(run: Path, cfg: ModelConfig) -> None:
    """A one-checkpoint run of a freshly built model, written by the trainer's saving code."""
    model = TapaLM(cfg)
    info = DistInfo(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"), initialized_here=False)
    (run / "config.json").parent.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"model": cfg.to_dict()}))
    saving.save_checkpoint(run, step=1, model=model, optimizer=torch.optim.AdamW(model.parameters()),
                           model_cfg=cfg, info=info, keep=1, extra={})


def test_refusals_are_one_line_naming_what_is_supported(rope_run, tmp_path):
    run, _ = rope_run
    supported = r"supported: tapa models whose layers are all global RoPE-family layers \(pe rope, [^\n]*$"
    tiny = dict(vocab_size=64, dim=32, n_layers=4, n_heads=2)
    save_run(tmp_path / "tapa-run", ModelConfig(pe="tapa", **tiny))
    write_pretrained(tmp_path / "nope-export", ModelConfig(pe="nope", **tiny),
                     TapaLM(ModelConfig(pe="nope", **tiny)).state_dict())
    convert(run, tmp_path / "hybrid", "--pe", "rope")
    for source, label in ((tmp_path / "tapa-run", r"a TAPA model \(pe 'tapa', layer_pattern 'G'\)"),
                          (tmp_path / "nope-export", r"a NoPE model"),
                          (tmp_path / "hybrid", r"a RoPE hybrid \(LLLG, w16\) model")):
        with pytest.raises(SystemExit, match=rf"^tapa convert: error: '{source}' holds {label}.*{supported}"):
            tapa_main(["convert", str(source), str(tmp_path / "out")])
    # a checkpoint away from its run: its tokenizer is unknown, and the line says how to bring one
    alone = tmp_path / "alone"
    shutil.copytree(run / "checkpoints" / "step_000002", alone)
    with pytest.raises(SystemExit, match=r"^tapa convert: error: the checkpoint is not inside a run directory.*"
                                         r"tapa export RUN DIR --tokenizer TOKENIZER\) and convert DIR[^\n]*$"):
        tapa_main(["convert", str(alone), str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()
