"""Evaluate trained runs: perplexity vs length (and optionally passkey retrieval) for the run's model
and, for a RoPE model, the same weights under eval-time scaling rules (PI, NTK, YaRN).

The result is a plain dict (written to results.json by `tapa.eval.report`):

    {"kind": "tapa-eval", "date", "hardware", "command", "split", "stride", "max_tokens",
     "methods": [{"label", "pe", "trained_pe", "run", "train_len", "zero_shot", "num_parameters",
                  "perplexity": [PerplexityResult.to_dict(), ...], "passkey": grid dict or None}]}
"""

from __future__ import annotations

import datetime
import os
import platform
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

from tapa.eval.passkey_eval import DEFAULT_DEPTHS, passkey_grid
from tapa.eval.perplexity import perplexity_vs_length
from tapa.eval.scaling import ROPE_FAMILY, SCALED_AT_EVAL, with_positional
from tapa.positional.kinds import model_label

DEFAULT_MULTIPLES = (0.5, 1, 2, 4, 8, 16)


def lengths_from_multiples(train_len: int, multiples=DEFAULT_MULTIPLES) -> list[int]:
    return sorted({max(1, int(round(train_len * m))) for m in multiples})


@dataclass
class EvalOptions:
    lengths: list[int] | None = None  # None: train_len * multiples
    multiples: tuple = DEFAULT_MULTIPLES
    stride: int = 256
    max_tokens: int | None = 16384  # tokens scored per length (a deterministic prefix of the split)
    split: str = "test"
    eval_pe: tuple = ()  # extra RoPE rules to evaluate a RoPE model under, e.g. ("rope-pi", "rope-yarn")
    passkey: bool = False
    passkey_lengths: list[int] | None = None  # None: train_len * (1, 2, 4, 8)
    passkey_depths: tuple = DEFAULT_DEPTHS
    passkey_trials: int = 5
    passkey_filler: str = "standard"  # standard | corpus
    seed: int = 0
    tokens_per_batch: int = 16384
    progress: bool = True
    extra: dict = field(default_factory=dict)  # recorded as is (e.g. the demo's settings)

    def __post_init__(self):
        if self.split not in ("val", "test"):
            raise ValueError(f"split must be 'val' or 'test' (held-out), got {self.split!r}")
        if self.passkey_filler not in ("standard", "corpus"):
            raise ValueError(f"passkey_filler must be 'standard' or 'corpus', got {self.passkey_filler!r}")
        for pe in self.eval_pe:
            if pe not in ROPE_FAMILY:
                raise ValueError(f"eval_pe entries must be RoPE-family methods {ROPE_FAMILY}, got {pe!r}")
        # checked here, before any evaluation runs, rather than where each setting is read
        if self.lengths is None and (not self.multiples or not all(m > 0 for m in self.multiples)):
            # a multiple <= 0 would become a length of 1 token
            raise ValueError(f"multiples must be positive numbers, got {list(self.multiples)}")
        if self.passkey:
            if not self.passkey_depths or not all(0.0 <= d <= 1.0 for d in self.passkey_depths):
                raise ValueError(f"passkey_depths must be numbers in [0, 1], got {list(self.passkey_depths)}")
            if not isinstance(self.passkey_trials, int) or self.passkey_trials < 1:
                raise ValueError(f"passkey_trials must be an int >= 1, got {self.passkey_trials!r}")


def hardware_description(device: torch.device | str = "cpu") -> str:
    device = torch.device(device)
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} (CUDA), torch {torch.__version__}"
    cpu = platform.processor() or platform.machine()
    try:
        model_name = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                          if line.startswith("model name"))
        cpu = model_name
    except (OSError, StopIteration):
        pass
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (f"CPU {cpu}, {usable} of {os.cpu_count()} cores usable, {torch.get_num_threads()} torch threads, "
            f"torch {torch.__version__}")


def results_header(options: EvalOptions, device) -> dict:
    now = datetime.datetime.now(datetime.timezone.utc)
    return {"kind": "tapa-eval", "date": now.isoformat(timespec="seconds"),
            "hardware": hardware_description(device), "command": " ".join(["tapa"] + sys.argv[1:]),
            "split": options.split, "stride": options.stride, "max_tokens": options.max_tokens,
            "settings": options.extra, "methods": []}


def evaluate_model(model, tokens, *, train_len: int, options: EvalOptions, trained_pe: str | None = None,
                   run: str = "", zero_shot: bool = True, encode=None, decode=None, filler_ids=None) -> dict:
    """One method entry: perplexity at every length (and the passkey grid if options.passkey).

    train_len: the training sequence length of the run (lengths are multiples of it).
    For rope-pi/rope-ntk/rope-yarn the eval factor is length / (train_len / trained rope_scale),
    never below the trained factor: a model continued at 4L with PI factor 4 gets 8 at 8L.
    """
    pe = model.config.pe
    trained_pe = trained_pe or pe
    cfg = model.config
    label = model_label(trained_pe, cfg.layer_pattern if cfg.is_hybrid else "G", cfg.local_window, eval_pe=pe)
    scaling_len = train_len / cfg.rope_scale if pe in SCALED_AT_EVAL else train_len
    lengths = options.lengths or lengths_from_multiples(train_len, options.multiples)
    perplexity = perplexity_vs_length(model, tokens, lengths=lengths, train_len=scaling_len,
                                      stride=options.stride, max_tokens=options.max_tokens,
                                      tokens_per_batch=options.tokens_per_batch,
                                      progress=options.progress, label=label)
    entry = {"label": label, "pe": pe, "trained_pe": trained_pe, "layer_pattern": cfg.layer_pattern,
             "local_window": cfg.local_window, "run": run, "train_len": train_len,
             "zero_shot": zero_shot, "num_parameters": model.num_parameters(),
             "perplexity": [r.to_dict() for r in perplexity], "passkey": None}
    if options.passkey:
        if encode is None:
            raise ValueError("passkey evaluation needs the tokenizer's encode function")
        passkey_lengths = options.passkey_lengths or [train_len * m for m in (1, 2, 4, 8)]
        entry["passkey"] = passkey_grid(
            model, encode, decode, lengths=passkey_lengths, depths=options.passkey_depths,
            trials=options.passkey_trials, seed=options.seed,
            filler_ids=filler_ids if options.passkey_filler == "corpus" else None,
            train_len=scaling_len, progress=options.progress, label=label)
    return entry


def evaluate_run(run_dir: str | Path, options: EvalOptions, *, device: str | torch.device = "cpu",
                 checkpoint: str | Path | None = None) -> dict:
    """Evaluate the latest checkpoint of `run_dir` (or `checkpoint`) on the run's held-out split."""
    from tapa.data import DataConfig, build_corpus
    from tapa.model.loading import load_model

    run_dir = Path(run_dir)
    if not (run_dir / "config.json").is_file():
        raise ValueError(f"run_dir {str(run_dir)!r} is not a training run (no config.json)")
    model, model_cfg, run_config = load_model(checkpoint or run_dir, device=device)
    train_len = int(run_config["train"]["seq_len"])
    corpus = build_corpus(DataConfig.from_dict(run_config["data"]), progress=options.progress)
    tokens = corpus.tokens(options.split)
    results = results_header(options, device)
    results["runs"] = [str(run_dir)]
    zero_shot = not run_config.get("init_from")
    variants = [model]
    if model_cfg.pe in ROPE_FAMILY:
        variants += [with_positional(model, pe, train_len) for pe in options.eval_pe if pe != model_cfg.pe]
    for variant in variants:
        results["methods"].append(evaluate_model(
            variant, tokens, train_len=train_len, options=options, trained_pe=model_cfg.pe,
            run=run_dir.name, zero_shot=zero_shot, encode=corpus.encode, decode=corpus.decode,
            filler_ids=tokens))
    return results
