"""The training loop: pretraining, continual pretraining from a checkpoint, exact resume.

One optimizer step:
    for each of grad_accum micro-batches of this rank's share of the global batch:
        loss_i = mean cross-entropy (float32) over the micro-batch;  backward(loss_i / grad_accum)
    gradients averaged over ranks (DDP / FSDP2), clipped to grad_clip (global norm), AdamW step
    with lr(step) = lr * (step + 1) / warmup_steps during warmup, then cosine from lr down to
    lr * min_lr_ratio at `steps`.
Every sequence has seq_len targets, so the mean of the ranks' and micro-batches' means is the mean
over the global batch, whatever the number of processes.

Logged records ("loss" is the mean training loss over the steps since the previous record):
    step, tokens, loss, lr, grad_norm, tokens_per_s, val_loss (when evaluated), elapsed_s
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import time
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.nn.functional as F

from tapa.data import Corpus, DataConfig, build_corpus
from tapa.model import ModelConfig, TapaLM
from tapa.train import checkpoint as ckpt
from tapa.train.config import (RESUME_MUTABLE, TrainConfig, check_continual, config_differences,
                               default_run_dir)
from tapa.train.distributed import (DistInfo, barrier, broadcast_object, mean_across_ranks,
                                    setup_distributed, teardown)
from tapa.train.loader import BatchLoader, validation_windows
from tapa.train.parallelize import compile_blocks, gradient_sync, parallelize, resolve_parallel

METRIC_FIELDS = ("step", "tokens", "loss", "lr", "grad_norm", "tokens_per_s", "val_loss", "elapsed_s")
# data settings that change which tokens a run sees (cache_dir only says where they are stored)
DATA_IGNORED_ON_RESUME = ("cache_dir",)


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Learning rate for optimizer step `step` (0-based)."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    span = max(1, cfg.steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
    return cfg.lr * (cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * cosine)


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW; weight decay on matrices (and embeddings), none on norms and vectors."""
    decay, no_decay = [], []
    for param in model.parameters():
        if param.requires_grad:
            (decay if param.dim() >= 2 else no_decay).append(param)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2))


def _micro_batch_size(cfg: TrainConfig, world_size: int) -> tuple[int, int]:
    """(micro_batch_size, grad_accum) for this world size."""
    if cfg.batch_size % world_size:
        raise ValueError(f"batch_size ({cfg.batch_size}) must be divisible by the number of "
                         f"processes ({world_size})")
    local = cfg.batch_size // world_size
    micro = cfg.micro_batch_size or local
    if local % micro:
        raise ValueError(f"micro_batch_size ({micro}) must divide the per-process batch "
                         f"({cfg.batch_size} / {world_size} processes = {local})")
    return micro, local // micro


def _prepare_run_dir(run_dir: Path, train_cfg: TrainConfig, model_cfg: ModelConfig,
                     data_cfg: DataConfig, corpus: Corpus) -> Path | None:
    """Check the run directory against the request; return the checkpoint to resume from."""
    if not train_cfg.resume:
        if (run_dir / "config.json").exists() or ckpt.has_checkpoint(run_dir):
            raise ValueError(f"run directory {str(run_dir)!r} already holds a run; pass --resume to "
                             "continue it, or choose another --run-dir")
        return None
    if not ckpt.has_checkpoint(run_dir):
        raise ValueError(f"--resume: run directory {str(run_dir)!r} has no checkpoint "
                         "(checkpoints/latest) to resume from")
    saved = json.loads((run_dir / "config.json").read_text())
    # through the dataclasses, so fields added since the run was saved take their defaults
    saved_model = ModelConfig.from_dict(saved["model"]).to_dict()
    saved_data = DataConfig.from_dict(saved["data"]).to_dict()
    saved_train = TrainConfig.from_dict(saved["train"]).to_dict()
    problems = []
    problems += [f"model.{d}" for d in config_differences(saved_model, model_cfg.to_dict())]
    problems += [f"data.{d}" for d in config_differences(saved_data, data_cfg.to_dict(),
                                                         DATA_IGNORED_ON_RESUME)]
    problems += [f"train.{d}" for d in config_differences(saved_train, train_cfg.to_dict(),
                                                          RESUME_MUTABLE)]
    for split in ("train", "val"):  # same settings can still give other tokens (another Python)
        saved_sha = saved.get("corpus", {}).get("splits", {}).get(split, {}).get("sha256")
        current_sha = corpus.manifest.get("splits", {}).get(split, {}).get("sha256")
        if saved_sha != current_sha:
            problems.append(f"corpus {split} tokens: sha256 {saved_sha} -> {current_sha}")
    if problems:
        raise ValueError(f"--resume: the requested config differs from the run in "
                         f"{str(run_dir)!r}: {problems}")
    return ckpt.resolve_checkpoint(run_dir)


def _load_corpus(data_cfg: DataConfig, info: DistInfo, progress: bool) -> Corpus:
    # rank 0 builds (or finds) the cache first; the others then read it
    corpus = build_corpus(data_cfg, progress=progress) if info.is_main else None
    barrier(info)
    return corpus if corpus is not None else build_corpus(data_cfg, progress=False)


def _tokenizer_sha(manifest: dict) -> str | None:
    return (manifest or {}).get("tokenizer", {}).get("sha256")


def _check_same_tokenizer(checkpoint: Path, corpus: Corpus) -> None:
    """Continual pretraining must read token ids the checkpoint was trained on."""
    run_config = checkpoint.parent.parent / "config.json"
    if not run_config.is_file():
        return  # a bare checkpoint directory: nothing to compare against
    saved = _tokenizer_sha(json.loads(run_config.read_text()).get("corpus"))
    current = _tokenizer_sha(corpus.manifest)
    if saved and current and saved != current:
        raise ValueError(f"the corpus' tokenizer (sha256 {current[:12]}) is not the one "
                         f"{str(checkpoint)!r} was trained with ({saved[:12]}); continue with the "
                         "same data settings, or pass --tokenizer with the original tokenizer dir")


class MetricsLog:
    """metrics.jsonl + metrics.csv in the run dir (rank 0). On resume, records after the
    checkpoint's step are dropped so the log continues the run exactly once."""

    def __init__(self, run_dir: Path, *, keep_until_step: int | None):
        self.jsonl = run_dir / "metrics.jsonl"
        self.csv = run_dir / "metrics.csv"
        records = []
        if keep_until_step is not None and self.jsonl.exists():
            records = [json.loads(line) for line in self.jsonl.read_text().splitlines() if line]
            records = [r for r in records if r["step"] <= keep_until_step]
        self.jsonl.write_text("".join(json.dumps(r) + "\n" for r in records))
        with open(self.csv, "w", newline="") as handle:
            writer = csv.DictWriter(handle, METRIC_FIELDS)
            writer.writeheader()
            writer.writerows({k: r.get(k) for k in METRIC_FIELDS} for r in records)
        self.records = records

    def append(self, record: dict) -> None:
        self.records.append(record)
        with open(self.jsonl, "a") as handle:
            handle.write(json.dumps(record) + "\n")
        with open(self.csv, "a", newline="") as handle:
            csv.DictWriter(handle, METRIC_FIELDS).writerow({k: record.get(k) for k in METRIC_FIELDS})


def plot_losses(records: list[dict], path: Path, title: str) -> bool:
    """Training (and validation) loss vs step as a PNG; False if matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([r["step"] for r in records], [r["loss"] for r in records], label="train")
    val = [r for r in records if r.get("val_loss") is not None]
    if val:
        ax.plot([r["step"] for r in val], [r["val_loss"] for r in val], "o-", label="val")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def train(train_cfg: TrainConfig, model_cfg: ModelConfig | None, data_cfg: DataConfig) -> Path:
    """Train and return the run directory. model_cfg may be None with init_from (the checkpoint's
    config is used). Under torchrun every process calls this; rank 0 logs and writes."""
    info = setup_distributed(train_cfg.device, need_group=train_cfg.parallel == "fsdp")
    try:
        return _train(train_cfg, model_cfg, data_cfg, info)
    finally:
        teardown(info)


def _train(train_cfg: TrainConfig, model_cfg: ModelConfig | None, data_cfg: DataConfig,
           info: DistInfo) -> Path:
    mode = resolve_parallel(train_cfg.parallel, info)
    micro, grad_accum = _micro_batch_size(train_cfg, info.world_size)
    device = info.device
    bf16 = train_cfg.precision == "bf16" or (train_cfg.precision == "auto" and device.type == "cuda")
    show = train_cfg.progress and info.is_main

    # --- model config: pretraining, or continual from a checkpoint ---------------------------
    init_checkpoint, init_weights = None, None
    # a resumed continual run restores its own checkpoint; the one it started from is not needed
    if train_cfg.init_from is not None and not train_cfg.resume:
        init_checkpoint = ckpt.resolve_checkpoint(train_cfg.init_from)
        base_cfg = ModelConfig.from_dict(ckpt.read_state(init_checkpoint)["model"])
        if model_cfg is None:
            model_cfg = base_cfg
        # the vocabulary follows the tokenizer, checked against the corpus below
        model_cfg = dataclasses.replace(model_cfg, vocab_size=base_cfg.vocab_size)
        check_continual(base_cfg, model_cfg)
        init_weights = ckpt.load_weights(init_checkpoint, model_cfg)
    elif model_cfg is None:
        raise ValueError("model_cfg is required unless init_from names a checkpoint "
                         "(a resumed run passes the model config of its config.json)")
    model_cfg = ModelConfig.from_dict(model_cfg.to_dict())  # our own copy

    corpus = _load_corpus(data_cfg, info, show)
    if init_checkpoint is not None:
        _check_same_tokenizer(init_checkpoint, corpus)
    if model_cfg.vocab_size != corpus.vocab_size:
        if init_checkpoint is not None:
            raise ValueError(f"the corpus' tokenizer has {corpus.vocab_size} tokens but the "
                             f"checkpoint {str(init_checkpoint)!r} has vocab_size "
                             f"{model_cfg.vocab_size}; continue on data with the same tokenizer")
        model_cfg = dataclasses.replace(model_cfg, vocab_size=corpus.vocab_size)

    run_dir = Path(train_cfg.run_dir) if train_cfg.run_dir else default_run_dir(train_cfg, model_cfg)
    # rank 0 checks the directory; every rank raises the same error, so none waits forever
    outcome = None
    if info.is_main:
        try:
            outcome = ("ok", _prepare_run_dir(run_dir, train_cfg, model_cfg, data_cfg, corpus))
        except ValueError as err:
            outcome = ("error", str(err))
    status, resume_from = broadcast_object(outcome, info)
    if status == "error":
        raise ValueError(resume_from)
    if info.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)

    # --- model, parallelism, optimizer ---------------------------------------------------------
    torch.manual_seed(train_cfg.seed)  # same initial weights on every rank and device
    model = TapaLM(model_cfg)
    if init_weights is not None:
        model.load_state_dict(init_weights)
    n_params = model.num_parameters()
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    if mode != "fsdp":
        model = model.to(device)
    if train_cfg.compile:
        compile_blocks(model)
    wrapped = parallelize(model, mode, info, bf16=bf16)
    optimizer = make_optimizer(wrapped, train_cfg)

    start_step = 0
    if resume_from is not None:
        state = ckpt.load_training_state(resume_from, model=wrapped, optimizer=optimizer,
                                         model_cfg=model_cfg, info=info)
        start_step = state["step"]
    end_step = min(train_cfg.steps, train_cfg.stop_after or train_cfg.steps)

    if info.is_main:
        previous = json.loads((run_dir / "config.json").read_text()) if resume_from else {}
        run_config = {
            "model": model_cfg.to_dict(), "data": data_cfg.to_dict(), "train": train_cfg.to_dict(),
            "corpus": corpus.manifest, "num_parameters": n_params, "world_size": info.world_size,
            "parallel": mode, "precision": "bf16" if bf16 else "fp32", "device": str(device),
            "init_from": (str(init_checkpoint) if init_checkpoint is not None
                          else previous.get("init_from")),
            "torch_version": torch.__version__,
        }
        ckpt.write_text_atomic(run_dir / "config.json", json.dumps(run_config, indent=2, default=str))
        log = MetricsLog(run_dir, keep_until_step=start_step if resume_from is not None else None)

    loader = BatchLoader(corpus.tokens("train"), seq_len=train_cfg.seq_len,
                         batch_size=train_cfg.batch_size, seed=train_cfg.seed, rank=info.rank,
                         world_size=info.world_size, passkey_fraction=train_cfg.passkey_fraction,
                         encode=corpus.encode if train_cfg.passkey_fraction > 0 else None)
    val_windows = validation_windows(corpus.tokens("val"), train_cfg.seq_len,
                                     train_cfg.eval_batches * train_cfg.batch_size)
    autocast = (torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else nullcontext())

    def forward_loss(batch: torch.Tensor) -> torch.Tensor:
        with autocast:
            logits = wrapped(batch[:, :-1])
        return F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten())

    def evaluate() -> float:
        wrapped.eval()
        share = len(val_windows) // info.world_size
        mine = torch.from_numpy(val_windows[info.rank * share:(info.rank + 1) * share])
        total = torch.zeros((), device=device)
        with torch.no_grad():
            for chunk in mine.split(micro):
                total += forward_loss(chunk.to(device)) * len(chunk)
        wrapped.train()
        return mean_across_ranks(total / share, info).item()

    tokens_per_step = train_cfg.batch_size * train_cfg.seq_len

    def save(step: int) -> None:
        ckpt.save_checkpoint(run_dir, step=step, model=wrapped, optimizer=optimizer,
                             model_cfg=model_cfg, info=info, keep=train_cfg.keep_checkpoints,
                             extra={"tokens": step * tokens_per_step,
                                    "samples": step * train_cfg.batch_size,
                                    "seed": train_cfg.seed})

    bar = None
    if show:
        from tapa._optional import require

        bar = require("tqdm").tqdm(total=train_cfg.steps, initial=start_step, unit="step",
                                   desc=f"train {model_cfg.pe} L={train_cfg.seq_len}",
                                   dynamic_ncols=True)
    wrapped.train()
    loss_sum = torch.zeros((), device=device)
    # a resumed run's clock continues from its last record
    elapsed_before = log.records[-1]["elapsed_s"] if info.is_main and log.records else 0.0
    steps_since_log, last_time = 0, time.perf_counter()
    started = last_time - elapsed_before
    for step in range(start_step, end_step):
        lr = lr_at(step, train_cfg)
        for group in optimizer.param_groups:
            group["lr"] = lr
        batch = torch.from_numpy(loader.batch(step)).to(device, non_blocking=True)
        for index, chunk in enumerate(batch.split(micro)):
            with gradient_sync(wrapped, sync=index == grad_accum - 1):
                loss = forward_loss(chunk)
                (loss / grad_accum).backward()
            loss_sum += loss.detach() / grad_accum
        max_norm = train_cfg.grad_clip if train_cfg.grad_clip > 0 else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(wrapped.parameters(), max_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        steps_since_log += 1
        done = step + 1

        last = done == end_step
        evaluate_now = last or (train_cfg.eval_every and done % train_cfg.eval_every == 0)
        if last or done % train_cfg.log_every == 0 or evaluate_now:
            mean_loss = mean_across_ranks(loss_sum / steps_since_log, info).item()
            if hasattr(grad_norm, "full_tensor"):  # FSDP2 returns a DTensor
                grad_norm = grad_norm.full_tensor()
            now = time.perf_counter()  # the .item() above waited for the GPU
            tokens_per_s = steps_since_log * tokens_per_step / (now - last_time)
            val_loss = evaluate() if evaluate_now else None
            record = {"step": done, "tokens": done * tokens_per_step, "loss": mean_loss, "lr": lr,
                      "grad_norm": float(grad_norm), "tokens_per_s": tokens_per_s,
                      "val_loss": val_loss, "elapsed_s": time.perf_counter() - started}
            if info.is_main:
                log.append(record)
            if bar is not None:
                postfix = {"loss": f"{mean_loss:.3f}", "tok/s": f"{record['tokens_per_s']:.0f}"}
                if val_loss is not None:
                    postfix["val"] = f"{val_loss:.3f}"
                bar.set_postfix(postfix)
            loss_sum.zero_()
            steps_since_log, last_time = 0, time.perf_counter()  # eval time is not training time
        if bar is not None:
            bar.update(1)
        if last or (train_cfg.save_every and done % train_cfg.save_every == 0):
            save(done)
    if bar is not None:
        bar.close()
    if info.is_main and train_cfg.plot and log.records:
        plot_losses(log.records, run_dir / "loss.png",
                    f"{train_cfg.name}: {model_cfg.pe}, seq_len {train_cfg.seq_len}")
    barrier(info)
    return run_dir
