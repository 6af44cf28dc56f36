"""`tapa demo`: build the built-in corpus, train a small RoPE and a small TAPA model on the same
token budget, evaluate both past the training length, print the table and write the plot.

Profiles (chosen by the device, or --tiny):
- cpu:  ~1M-parameter models, 128-token training (2M tokens each), evaluated at 1x-8x; about
        6 minutes on 2 idle cores.
- cuda: ~30M-parameter models, 512-token training, evaluated at 1x-16x, plus a passkey grid
        (both models see 2% passkey sequences in training).
- tiny: seconds; exercises every stage (CI).

The RoPE model is also evaluated under eval-time PI, NTK, YaRN and dynamic-NTK scaling (the same
weights; the rotation has none), so the table shows RoPE, PI, NTK, YaRN and TAPA side by side.
TAPA uses what DESIGN.md reports worked best at toy scale: phase rows of W_q, W_k scaled by 0.1 at
init and a BPE tokenizer. Learning rates: each method's best of a small sweep at the cpu profile
(RoPE 1e-3/2e-3/4e-3 -> 2e-3; TAPA 1e-3/2e-3/3e-3/4e-3 -> 1e-3, higher diverged); see
results/demo-cpu/README.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from tapa.eval.evaluate import EvalOptions, evaluate_run
from tapa.eval.report import growth_summary, merge_results, perplexity_table, write_results

DEMO_METHODS = ("rope", "tapa")


@dataclass(frozen=True)
class DemoProfile:
    name: str
    # data
    vocab_size: int
    max_train_bytes: int | None
    tokenizer_train_bytes: int | None
    # model (both methods)
    dim: int
    n_layers: int
    n_heads: int
    phase_init_scale: float
    # training (same budget for both methods)
    seq_len: int
    batch_size: int
    steps: int
    warmup_steps: int
    lr: dict = field(default_factory=dict)  # per method
    passkey_fraction: float = 0.0
    # evaluation
    multiples: tuple = (1, 2, 4, 8)
    stride: int = 256
    max_tokens: int = 8192
    eval_pe: tuple = ("rope-pi", "rope-ntk", "rope-yarn", "rope-dynamic-ntk")
    passkey: bool = False
    passkey_trials: int = 5

    def describe(self) -> str:
        tokens = self.steps * self.batch_size * self.seq_len
        return (f"profile {self.name}: dim {self.dim}, {self.n_layers} layers, {self.n_heads} heads, "
                f"BPE-{self.vocab_size}; {self.steps} steps x {self.batch_size} x {self.seq_len} tokens "
                f"= {tokens / 1e6:.2f}M tokens per model; lr " +
                ", ".join(f"{pe} {lr:g}" for pe, lr in self.lr.items()) +
                f"; eval at {', '.join(f'{m:g}x' for m in self.multiples)} the training length")


PROFILES = {
    "cpu": DemoProfile(
        name="cpu", vocab_size=2048, max_train_bytes=2_000_000, tokenizer_train_bytes=None,
        dim=128, n_layers=3, n_heads=4, phase_init_scale=0.1,
        seq_len=128, batch_size=16, steps=1000, warmup_steps=50, lr={"rope": 2e-3, "tapa": 1e-3},
        multiples=(1, 2, 4, 8), stride=256, max_tokens=8192),
    "cuda": DemoProfile(
        name="cuda", vocab_size=8192, max_train_bytes=None, tokenizer_train_bytes=10_000_000,
        dim=512, n_layers=8, n_heads=4, phase_init_scale=0.1,
        seq_len=512, batch_size=32, steps=1500, warmup_steps=100, lr={"rope": 1e-3, "tapa": 3e-4},
        passkey_fraction=0.02, multiples=(1, 2, 4, 8, 16), stride=256, max_tokens=32768,
        passkey=True, passkey_trials=5),
    "tiny": DemoProfile(
        name="tiny", vocab_size=300, max_train_bytes=100_000, tokenizer_train_bytes=None,
        dim=32, n_layers=1, n_heads=2, phase_init_scale=0.1,
        seq_len=32, batch_size=4, steps=4, warmup_steps=1, lr={"rope": 1e-3, "tapa": 3e-4},
        multiples=(1, 2), stride=16, max_tokens=128),
}


def pick_profile(device: torch.device, tiny: bool) -> DemoProfile:
    if tiny:
        return PROFILES["tiny"]
    return PROFILES["cuda" if device.type == "cuda" else "cpu"]


def _configs(profile: DemoProfile, pe: str, run_dir: Path, device: torch.device, progress: bool,
             cache_dir: str | None):
    from tapa.data import DataConfig
    from tapa.model import ModelConfig
    from tapa.train import TrainConfig

    data_values = dict(source="builtin", vocab_size=profile.vocab_size,
                       max_train_bytes=profile.max_train_bytes,
                       tokenizer_train_bytes=profile.tokenizer_train_bytes)
    if cache_dir:
        data_values["cache_dir"] = cache_dir
    data_cfg = DataConfig(**data_values)
    model_cfg = ModelConfig(vocab_size=profile.vocab_size, dim=profile.dim, n_layers=profile.n_layers,
                            n_heads=profile.n_heads, pe=pe, original_seq_len=profile.seq_len,
                            phase_init_scale=profile.phase_init_scale if pe.startswith("tapa") else 1.0)
    train_cfg = TrainConfig(name=f"demo-{pe}", run_dir=str(run_dir), seq_len=profile.seq_len,
                            batch_size=profile.batch_size, steps=profile.steps, lr=profile.lr[pe],
                            warmup_steps=profile.warmup_steps, eval_every=0, save_every=0,
                            eval_batches=2, log_every=max(1, profile.steps // 20), seed=0,
                            device=str(device), passkey_fraction=profile.passkey_fraction,
                            progress=progress, plot=True)
    return train_cfg, model_cfg, data_cfg


def run_demo(profile: DemoProfile, out_dir: str | Path, *, device: torch.device, progress: bool = True,
             cache_dir: str | None = None, command: str = "tapa demo", log=print) -> dict:
    """Train both models, evaluate them, write results to out_dir; return the merged results."""
    from tapa.data import build_corpus
    from tapa.train import train

    out_dir = Path(out_dir)
    started = time.perf_counter()
    stage_seconds = {}
    n_stages = 2 + len(DEMO_METHODS)
    log(profile.describe())

    log(f"[1/{n_stages}] corpus: the built-in Python-stdlib text, BPE tokenizer")
    tick = time.perf_counter()
    data_cfg = _configs(profile, "rope", out_dir / "rope", device, progress, cache_dir)[2]
    corpus = build_corpus(data_cfg, progress=progress)
    profile = dataclasses.replace(profile, vocab_size=corpus.vocab_size)
    stage_seconds["corpus"] = time.perf_counter() - tick

    run_dirs = {}
    for index, pe in enumerate(DEMO_METHODS, start=2):
        log(f"[{index}/{n_stages}] train {pe} (lr {profile.lr[pe]:g})")
        tick = time.perf_counter()
        run_dirs[pe] = train(*_configs(profile, pe, out_dir / pe, device, progress, cache_dir))
        stage_seconds[f"train_{pe}"] = time.perf_counter() - tick

    log(f"[{n_stages}/{n_stages}] evaluate: sliding-window perplexity at "
        f"{', '.join(f'{m:g}x' for m in profile.multiples)} the training length"
        + (" and passkey retrieval" if profile.passkey else ""))
    tick = time.perf_counter()
    options = EvalOptions(multiples=profile.multiples, stride=profile.stride, max_tokens=profile.max_tokens,
                          split="test", eval_pe=profile.eval_pe, passkey=profile.passkey,
                          passkey_trials=profile.passkey_trials, progress=progress,
                          extra={"profile": dataclasses.asdict(profile)})
    per_run = [evaluate_run(run_dirs[pe], options, device=device) for pe in DEMO_METHODS]
    stage_seconds["evaluate"] = time.perf_counter() - tick
    results = merge_results(per_run, command=command)
    results["settings"] = {"profile": dataclasses.asdict(profile), "stage_seconds": stage_seconds,
                           "wall_seconds": time.perf_counter() - started,
                           "final_val_loss": {pe: _final_val_loss(run_dirs[pe]) for pe in DEMO_METHODS}}
    write_results(results, out_dir, title=f"tapa demo ({profile.name}): trained at {profile.seq_len} tokens")
    return results


def _final_val_loss(run_dir: Path) -> float | None:
    """The last validation loss the trainer logged (metrics.jsonl), if any."""
    import json

    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        return None
    losses = [record["val_loss"] for record in map(json.loads, path.read_text().splitlines())
              if record.get("val_loss") is not None]
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
                        help="replace the rope/ and tapa/ runs of an earlier demo in --out")
    parser.add_argument("--no-progress", action="store_true")


def run(args: argparse.Namespace) -> int:
    from tapa.eval.command import resolve_device

    device = resolve_device(args.device)
    profile = PROFILES[args.profile] if args.profile else pick_profile(device, args.tiny)
    out_dir = Path(args.out) if args.out else _fresh_dir(Path(f"runs/demo-{profile.name}"))
    existing = [out_dir / pe for pe in DEMO_METHODS if (out_dir / pe).exists()]
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
    print(f"RoPE+X = the RoPE model with eval-time X scaling. Hardware: {results['hardware']}")
    stages = ", ".join(f"{name} {seconds:.0f}s" for name, seconds in settings["stage_seconds"].items())
    print(f"Wall time {settings['wall_seconds']:.0f}s ({stages}).")
    print(f"Files in {out_dir}/: results.md (tables), results.json (all numbers), perplexity.png "
          f"(the plot), position_loss.png; training runs in {out_dir}/rope and {out_dir}/tapa")
    return 0
