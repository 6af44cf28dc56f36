"""`tapa demo`: build the built-in corpus, train a small RoPE model, a small TAPA model, a small
TAPA hybrid and the same hybrid with NoPE globals on the same token budget, evaluate them past the
training length, print the table and write the plot.

The models (DEMO_MODELS), all the same size:
- RoPE; the table adds its weights under eval-time PI, NTK, YaRN and dynamic-NTK scaling (no
  extra training), so RoPE+YaRN sits beside the trained models.
- TAPA in every layer.
- The TAPA hybrid: layer pattern LLLG, three local RoPE layers in a sliding window of half the
  training length, then one global TAPA layer (`ModelConfig.layer_pattern`).
- The NoPE hybrid: the same layout with global layers without positional encoding and the
  log-length query temperature based at the training length (`query_temperature_base`): the best
  hybrid the globals study measured (results/toy-study/globals, recipes/toy-gpu-hybrid-nope.toml).
Both TAPA models use the recipe of the toy study (results/toy-study): the phase rows of W_q, W_k
scaled by 0.1 at init and learning at 0.1x the learning rate (phase_lr_scale). Each model trains
at its family's best learning rate (the study's on the GPU; a small sweep at the cpu profile,
results/demo-cpu/README.md).

Profiles (chosen by the device, or --tiny):
- cpu:  ~1M-parameter models, 128-token training, evaluated at 1x-8x; about 10 minutes on 2 cores (621 s).
- cuda: ~30M-parameter models (the study's toy-gpu size), 512-token training on stdlib +
        site-packages Python, evaluated at 1x-16x, plus a passkey grid (every model sees 2% passkey
        sequences in training); about 5 minutes on one H100 (308 s, results/demo-gpu).
- tiny: seconds; exercises every stage and every model (CI).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from tapa._paths import check_not_in_run
from tapa.eval.evaluate import EvalOptions, evaluate_run
from tapa.eval.report import growth_summary, merge_results, perplexity_table, write_results


@dataclass(frozen=True)
class DemoModel:
    """One trained model of the demo. `name` is its run directory and its key in DemoProfile.lr."""
    name: str
    pe: str
    layer_pattern: str = "G"
    query_temperature: bool = False  # the global layers' query temperature, based at the training length


DEMO_MODELS = (DemoModel("rope", "rope"), DemoModel("tapa", "tapa"), DemoModel("hybrid", "tapa", "LLLG"),
               DemoModel("hybrid-nope", "nope", "LLLG", query_temperature=True))


@dataclass(frozen=True)
class DemoProfile:
    name: str
    # data
    vocab_size: int
    max_train_bytes: int | None
    tokenizer_train_bytes: int | None
    # model (every model; n_layers >= 4 so that LLLG has a global layer)
    dim: int
    n_layers: int
    n_heads: int
    phase_init_scale: float
    # training (the same budget for every model)
    seq_len: int
    batch_size: int
    steps: int
    warmup_steps: int
    lr: dict = field(default_factory=dict)  # per DemoModel.name
    phase_lr_scale: float = 0.1
    include_site_packages: bool = False
    passkey_fraction: float = 0.0
    # evaluation
    multiples: tuple = (1, 2, 4, 8)
    stride: int = 256
    max_tokens: int = 8192
    eval_pe: tuple = ("rope-pi", "rope-ntk", "rope-yarn", "rope-dynamic-ntk")
    passkey: bool = False
    passkey_trials: int = 5

    @property
    def local_window(self) -> int:
        """The hybrid's window: half the training length, as the study's w256 at 512, so a local
        layer never sees a whole training sequence and the global layer must carry position."""
        return max(1, self.seq_len // 2)

    @property
    def tokens_per_model(self) -> int:
        return self.steps * self.batch_size * self.seq_len

    def describe(self) -> str:
        lrs = ", ".join(f"{model.name} {self.lr[model.name]:g}" for model in DEMO_MODELS)
        return (f"profile {self.name}: dim {self.dim}, {self.n_layers} layers, {self.n_heads} heads, "
                f"BPE-{self.vocab_size}; hybrids LLLG with a {self.local_window}-token window; "
                f"{self.steps} steps x {self.batch_size} x {self.seq_len} tokens = "
                f"{self.tokens_per_model / 1e6:.2f}M tokens per model; lr {lrs} (TAPA phase rows at "
                f"{self.phase_lr_scale:g}x); eval at {', '.join(f'{m:g}x' for m in self.multiples)} "
                "the training length")


PROFILES = {
    # 700 steps: the four 4-layer models take 10.4 minutes on 2 cores (2026-12-06); 5 MB of text
    # is about one epoch of the 1.43M training tokens. lr: each family's best of 2e-3 / 4e-3 at
    # this profile (results/demo-cpu/README.md); 4e-3, the edge of that sweep, won for the first
    # three, and the NoPE hybrid (not swept) takes the TAPA hybrid's
    "cpu": DemoProfile(
        name="cpu", vocab_size=2048, max_train_bytes=5_000_000, tokenizer_train_bytes=None,
        dim=128, n_layers=4, n_heads=4, phase_init_scale=0.1,
        seq_len=128, batch_size=16, steps=700, warmup_steps=50,
        lr={"rope": 4e-3, "tapa": 4e-3, "hybrid": 4e-3, "hybrid-nope": 4e-3},
        multiples=(1, 2, 4, 8), stride=256, max_tokens=8192),
    # the study's learning rates (results/toy-study/lr_sweep.md, 100M tokens at batch 64) and its
    # corpus kind (both hybrids at the study's 1e-3); 1000 steps keep the whole demo within a few
    # minutes on an H200
    "cuda": DemoProfile(
        name="cuda", vocab_size=8192, max_train_bytes=150_000_000, tokenizer_train_bytes=10_000_000,
        include_site_packages=True, dim=512, n_layers=8, n_heads=4, phase_init_scale=0.1,
        seq_len=512, batch_size=64, steps=1000, warmup_steps=100,
        lr={"rope": 1e-3, "tapa": 2e-3, "hybrid": 1e-3, "hybrid-nope": 1e-3},
        passkey_fraction=0.02, multiples=(1, 2, 4, 8, 16), stride=256, max_tokens=32768,
        passkey=True, passkey_trials=5),
    "tiny": DemoProfile(
        name="tiny", vocab_size=300, max_train_bytes=100_000, tokenizer_train_bytes=None,
        dim=32, n_layers=4, n_heads=2, phase_init_scale=0.1,
        seq_len=32, batch_size=4, steps=4, warmup_steps=1,
        lr={"rope": 1e-3, "tapa": 2e-3, "hybrid": 1e-3, "hybrid-nope": 1e-3},
        multiples=(1, 2), stride=16, max_tokens=128),
}


def pick_profile(device: torch.device, tiny: bool) -> DemoProfile:
    if tiny:
        return PROFILES["tiny"]
    return PROFILES["cuda" if device.type == "cuda" else "cpu"]


def _data_config(profile: DemoProfile, cache_dir: str | None):
    from tapa.data import DataConfig

    values = dict(source="builtin", vocab_size=profile.vocab_size, max_train_bytes=profile.max_train_bytes,
                  tokenizer_train_bytes=profile.tokenizer_train_bytes,
                  include_site_packages=profile.include_site_packages)
    if cache_dir:
        values["cache_dir"] = cache_dir
    return DataConfig(**values)


def demo_configs(profile: DemoProfile, model: DemoModel, run_dir: Path, device: torch.device, progress: bool,
                 cache_dir: str | None):
    """(TrainConfig, ModelConfig, DataConfig) of one demo model."""
    from tapa.model import ModelConfig
    from tapa.train import TrainConfig

    model_cfg = ModelConfig(vocab_size=profile.vocab_size, dim=profile.dim, n_layers=profile.n_layers,
                            n_heads=profile.n_heads, pe=model.pe, layer_pattern=model.layer_pattern,
                            local_window=profile.local_window, original_seq_len=profile.seq_len,
                            query_temperature_base=profile.seq_len if model.query_temperature else 0,
                            phase_init_scale=profile.phase_init_scale if model.pe.startswith("tapa") else 1.0)
    train_cfg = TrainConfig(name=f"demo-{model.name}", run_dir=str(run_dir), seq_len=profile.seq_len,
                            batch_size=profile.batch_size, steps=profile.steps, lr=profile.lr[model.name],
                            phase_lr_scale=profile.phase_lr_scale, warmup_steps=profile.warmup_steps,
                            eval_every=0, save_every=0, eval_batches=2,
                            log_every=max(1, profile.steps // 20), seed=0, device=str(device),
                            passkey_fraction=profile.passkey_fraction, progress=progress, plot=True)
    return train_cfg, model_cfg, _data_config(profile, cache_dir)


def corpus_summary(run_dir: Path) -> dict:
    """What a demo run read, from its config.json: the trainer's data plan (train_tokens,
    run_tokens, epochs, ...) and the token counts of the held-out splits."""
    config = json.loads((Path(run_dir) / "config.json").read_text())
    splits = config["corpus"]["splits"]
    return {**config["data_plan"], "val_tokens": splits["val"]["tokens"], "test_tokens": splits["test"]["tokens"]}


def describe_corpus(summary: dict) -> str:
    return (f"Corpus: {summary['train_tokens'] / 1e6:.2f}M train tokens (val {summary['val_tokens'] / 1e6:.2f}M, "
            f"test {summary['test_tokens'] / 1e6:.2f}M); each model read {summary['run_tokens'] / 1e6:.2f}M "
            f"tokens = {summary['epochs']:.2f} epochs")


def run_demo(profile: DemoProfile, out_dir: str | Path, *, device: torch.device, progress: bool = True,
             cache_dir: str | None = None, command: str = "tapa demo", log=print) -> dict:
    """Train every demo model, evaluate them, write results to out_dir; return the merged results."""
    from tapa.data import build_corpus
    from tapa.train import train

    out_dir = Path(out_dir)
    started = time.perf_counter()
    stage_seconds = {}
    n_stages = 2 + len(DEMO_MODELS)
    log(profile.describe())

    log(f"[1/{n_stages}] corpus: the built-in Python text"
        + (" (stdlib and site-packages)" if profile.include_site_packages else " (stdlib)") + ", BPE tokenizer")
    tick = time.perf_counter()
    corpus = build_corpus(_data_config(profile, cache_dir), progress=progress)
    profile = dataclasses.replace(profile, vocab_size=corpus.vocab_size)
    stage_seconds["corpus"] = time.perf_counter() - tick

    run_dirs = {}
    for index, model in enumerate(DEMO_MODELS, start=2):
        configs = demo_configs(profile, model, out_dir / model.name, device, progress, cache_dir)
        log(f"[{index}/{n_stages}] train {configs[1].label} (lr {profile.lr[model.name]:g})")
        tick = time.perf_counter()
        run_dirs[model.name] = train(*configs)
        stage_seconds[f"train_{model.name}"] = time.perf_counter() - tick

    log(f"[{n_stages}/{n_stages}] evaluate: sliding-window perplexity at "
        f"{', '.join(f'{m:g}x' for m in profile.multiples)} the training length"
        + (" and passkey retrieval" if profile.passkey else ""))
    tick = time.perf_counter()
    options = EvalOptions(multiples=profile.multiples, stride=profile.stride, max_tokens=profile.max_tokens,
                          split="test", eval_pe=profile.eval_pe, passkey=profile.passkey,
                          passkey_trials=profile.passkey_trials, progress=progress,
                          extra={"profile": dataclasses.asdict(profile)})
    per_run = [evaluate_run(run_dirs[model.name], options, device=device) for model in DEMO_MODELS]
    stage_seconds["evaluate"] = time.perf_counter() - tick
    results = merge_results(per_run, command=command)
    results["settings"] = {"profile": dataclasses.asdict(profile),
                           "corpus": corpus_summary(run_dirs[DEMO_MODELS[0].name]),
                           "stage_seconds": stage_seconds, "wall_seconds": time.perf_counter() - started,
                           "final_val_loss": {model.name: _final_val_loss(run_dirs[model.name])
                                              for model in DEMO_MODELS}}
    write_results(results, out_dir, title=f"tapa demo ({profile.name}): trained at {profile.seq_len} tokens")
    return results


def _final_val_loss(run_dir: Path) -> float | None:
    """The last validation loss the trainer logged (metrics.jsonl), if any."""
    from tapa.train.rundir import read_metrics

    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        return None
    losses = [record["val_loss"] for record in read_metrics(path) if record.get("val_loss") is not None]
    return losses[-1] if losses else None


def _fresh_dir(base: Path) -> Path:
    """base, or base-2, base-3, ... : the first that does not exist (a rerun keeps earlier demos)."""
    candidate, number = base, 1
    while candidate.exists():
        number += 1
        candidate = base.with_name(f"{base.name}-{number}")
    return candidate


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tiny", action="store_true",
                        help="a seconds-long run that exercises every stage (CI)")
    parser.add_argument("--profile", choices=sorted(PROFILES), default=None,
                        help="override the profile chosen from the device")
    parser.add_argument("--out", default=None,
                        help="output directory (default: runs/demo-<profile>, or -2, -3, ... if it exists)")
    parser.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda, ...")
    parser.add_argument("--force", action="store_true",
                        help="replace the runs of an earlier demo in --out (rope/, tapa/, hybrid/, hybrid-nope/)")
    parser.add_argument("--no-progress", action="store_true")


def run(args: argparse.Namespace) -> int:
    from tapa.eval.command import resolve_device

    device = resolve_device(args.device)
    profile = PROFILES[args.profile] if args.profile else pick_profile(device, args.tiny)
    out_dir = Path(args.out) if args.out else _fresh_dir(Path(f"runs/demo-{profile.name}"))
    check_not_in_run(out_dir, command="tapa demo")  # --force would delete a run's folders there
    existing = [out_dir / model.name for model in DEMO_MODELS if (out_dir / model.name).exists()]
    if existing and not args.force:
        raise ValueError(f"--out {str(out_dir)!r} already holds a demo ({', '.join(map(str, existing))}); "
                         "pass --force to replace it or choose another --out")
    for path in existing:
        shutil.rmtree(path)
    command = " ".join(["tapa demo"] + (["--tiny"] if args.tiny else [])
                       + [f"--{name} {value}"
                          for name, value in (("profile", args.profile), ("out", args.out)) if value]
                       + ([f"--device {args.device}"] if args.device != "auto" else []))
    results = run_demo(profile, out_dir, device=device, progress=not args.no_progress, command=command)
    settings = results["settings"]
    print()
    print(f"Perplexity (test split, sliding window) of models trained at {profile.seq_len} tokens:")
    print(perplexity_table(results["methods"]))
    print(f"\n{growth_summary(results['methods'])}")
    print(f"RoPE+X = the RoPE model with eval-time X scaling. {describe_corpus(settings['corpus'])}.")
    print(f"Hardware: {results['hardware']}")
    stages = ", ".join(f"{name} {seconds:.0f}s" for name, seconds in settings["stage_seconds"].items())
    print(f"Wall time {settings['wall_seconds']:.0f}s ({stages}).")
    print(f"Files in {out_dir}/: results.md (tables), results.json (all numbers), perplexity.png "
          f"(the plot), position_loss.png; training runs in "
          + ", ".join(f"{out_dir}/{model.name}" for model in DEMO_MODELS))
    return 0
