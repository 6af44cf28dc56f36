"""The training loop: pretraining, continual pretraining from a checkpoint, exact resume.

One optimizer step:
    for each of grad_accum micro-batches of this rank's share of the global batch:
        loss_i = mean cross-entropy (float32) over the micro-batch;  backward(loss_i / grad_accum)
    gradients averaged over ranks (DDP / FSDP2), clipped to grad_clip (global norm), AdamW step
    with lr(step) = lr * (step + 1) / warmup_steps during warmup, then cosine from lr down to
    lr * min_lr_ratio at `steps`; each parameter group learns at lr(step) * its lr_scale
    (phase_lr_scale for the TAPA phase parameters, 1 for the rest).
Every sequence has seq_len targets, so the mean of the ranks' and micro-batches' means is the mean
over the global batch, whatever the number of processes.

Context parallelism (cp > 1, `tapa.train.context_parallel`): the processes form a (data x context)
mesh of W / cp data groups of cp ranks; the ranks of a data group read the same rows, each keeps
two of every row's 2 cp chunks, and the model's loss is already the mean over every rank's tokens.
The data-parallel wrapper (DDP / FSDP2) spans all W ranks. Batches, the data plan and checkpoints
depend on the number of data groups only through the batch's split, so a run saved at one cp
resumes at another.

Logged records ("loss" is the mean training loss over the steps since the previous scheduled
record; a resumed run carries that window over in its checkpoint, so it logs the numbers of an
uninterrupted run):
    step, tokens, epochs, loss, lr, grad_norm, tokens_per_s, val_loss (when evaluated), elapsed_s
A non-finite loss or gradient norm stops the run with NonFiniteError naming the first such step,
before any later checkpoint is written.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.distributed as dist

from tapa.data import Corpus, DataConfig, build_corpus
from tapa.model import Documents, ModelConfig, TapaLM, is_phase_parameter
from tapa.train import saving as ckpt
from tapa.model.loading import is_model_dir
from tapa.train.config import TrainConfig, check_checkpoint_blocks, check_continual, default_run_dir
from tapa.train.context_parallel import ContextParallel
from tapa.train.distributed import (DistInfo, barrier, broadcast_object, mean_across_ranks,
                                    setup_distributed, teardown)
from tapa.train.loader import BatchLoader, validation_windows
from tapa.train.parallelize import compile_blocks, gradient_sync, parallelize, resolve_parallel
from tapa.train.rundir import (MetricsLog, check_same_tokenizer, is_scheduled_log, plot_losses,
                               prepare_run_dir, read_run_config)

_NO_STEP = 2 ** 62  # "no non-finite step yet"


class NonFiniteError(RuntimeError):
    """The training loss or gradient norm became inf or nan."""


class NotDeterministicError(RuntimeError):
    """--deterministic, and the run reached an op with no deterministic version."""


_NO_DETERMINISTIC = " does not have a deterministic implementation"  # torch's message for it


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Learning rate for optimizer step `step` (0-based), before a group's lr_scale."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    span = max(1, cfg.steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
    return cfg.lr * (cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * cosine)


def parameter_groups(model: torch.nn.Module, cfg: TrainConfig) -> list[dict]:
    """AdamW parameter groups by name (so DDP's, FSDP2's and compile's wrappers do not matter):
    weight decay on matrices and embeddings, none on norms and vectors; the TAPA phase
    parameters (tapa.model.is_phase_parameter) at lr_scale = phase_lr_scale, the rest at 1."""
    groups: dict[tuple[bool, bool], list] = {}
    for name, param in model.named_parameters():
        if param.requires_grad:
            groups.setdefault((param.dim() >= 2, is_phase_parameter(name)), []).append(param)
    return [{"params": groups[key], "weight_decay": cfg.weight_decay if key[0] else 0.0,
             "lr_scale": cfg.phase_lr_scale if key[1] else 1.0}
            for key in ((True, False), (False, False), (True, True), (False, True)) if key in groups]


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    return torch.optim.AdamW(parameter_groups(model, cfg), lr=cfg.lr, betas=(cfg.beta1, cfg.beta2))


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr * group["lr_scale"]


def _micro_batch_size(cfg: TrainConfig, world_size: int) -> tuple[int, int]:
    """(micro_batch_size, grad_accum) for this world size (of data-parallel groups under CP)."""
    groups = "processes" if cfg.cp == 1 else f"data-parallel groups (processes / cp {cfg.cp})"
    if cfg.batch_size % world_size:
        raise ValueError(f"batch_size ({cfg.batch_size}) must be divisible by the number of "
                         f"{groups} ({world_size})")
    local = cfg.batch_size // world_size
    micro = cfg.micro_batch_size or local
    if local % micro:
        raise ValueError(f"micro_batch_size ({micro}) must divide the per-process batch "
                         f"({cfg.batch_size} / {world_size} {groups} = {local})")
    return micro, local // micro


def _load_corpus(data_cfg: DataConfig, info: DistInfo, progress: bool) -> Corpus:
    # rank 0 builds (or finds) the cache first; the others then read it
    corpus = build_corpus(data_cfg, progress=progress) if info.is_main else None
    barrier(info)
    return corpus if corpus is not None else build_corpus(data_cfg, progress=False)


def data_plan(train_tokens: int, windows_per_epoch: int, cfg: TrainConfig) -> dict:
    """How much of the corpus the run reads: tokens, and passes over the training split."""
    tokens_per_step = cfg.batch_size * cfg.seq_len
    return {"train_tokens": train_tokens, "tokens_per_step": tokens_per_step,
            "run_tokens": cfg.steps * tokens_per_step,
            "epochs": cfg.steps * cfg.batch_size / windows_per_epoch}


class _FiniteGuard:
    """Remembers the first step whose loss or gradient norm was not finite, on the device (no
    host sync per step); `check` (collective) raises on every rank if any rank saw one."""

    def __init__(self, device: torch.device, info: DistInfo):
        self.info = info
        self.first = torch.full((), _NO_STEP, dtype=torch.int64, device=device)
        self.values = torch.zeros(2, device=device)

    def observe(self, step: int, loss: torch.Tensor, grad_norm: torch.Tensor) -> None:
        if hasattr(grad_norm, "to_local"):  # FSDP2: this rank's share; any nan shows on some rank
            grad_norm = grad_norm.to_local()
        current = torch.stack([loss.float(), grad_norm.float()])
        new = ~torch.isfinite(current).all() & (self.first == _NO_STEP)
        self.first = torch.where(new, step, self.first)
        self.values = torch.where(new, current, self.values)

    def check(self, cfg: TrainConfig) -> None:
        first = self.first.clone()
        if self.info.active and self.info.world_size > 1:
            dist.all_reduce(first, op=dist.ReduceOp.MIN)
        step = int(first.item())
        if step != _NO_STEP:
            detail = ""
            if int(self.first.item()) == step:
                loss, norm = self.values.tolist()
                detail = f" (loss {loss}, gradient norm {norm})"
            raise NonFiniteError(
                f"training stopped: the loss or gradient norm is not finite at step {step}{detail}, "
                f"learning rate {lr_at(step - 1, cfg):.3g}. No checkpoint was written for it; "
                "resume from the last checkpoint with a lower --lr or a longer --warmup-steps, "
                "or check the data")


def train(train_cfg: TrainConfig, model_cfg: ModelConfig | None, data_cfg: DataConfig) -> Path:
    """Train and return the run directory. model_cfg may be None with init_from (the checkpoint's
    config is used). Under torchrun every process calls this; rank 0 logs and writes."""
    info = setup_distributed(train_cfg.device, need_group=train_cfg.parallel == "fsdp")
    before = (torch.are_deterministic_algorithms_enabled(),
              torch.is_deterministic_algorithms_warn_only_enabled())
    workspace = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    if train_cfg.deterministic:
        # cuBLAS reads its workspace setting when it sets up a handle: before the first matmul
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        if not before[0]:  # strict; a caller's own mode, warn-only included, is kept
            torch.use_deterministic_algorithms(True)
    try:
        return _train(train_cfg, model_cfg, data_cfg, info)
    except RuntimeError as err:
        if not (train_cfg.deterministic and _NO_DETERMINISTIC in str(err)):
            raise
        op = str(err).split(_NO_DETERMINISTIC)[0]
        raise NotDeterministicError(
            f"--deterministic: {op} has no deterministic version here, so the run could not promise "
            "to repeat. Train without --deterministic, or call torch.use_deterministic_algorithms("
            "True, warn_only=True) before tapa.train.train for a run that warns instead") from err
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
        if workspace is None:
            os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
        teardown(info)


def _continual_start(train_cfg: TrainConfig, model_cfg: ModelConfig | None):
    """(model config, checkpoint, weights) of a continual run; (model_cfg, None, None) otherwise."""
    # a resumed continual run restores its own checkpoint; the one it started from is not needed
    if train_cfg.init_from is None or train_cfg.resume:
        if model_cfg is None:
            raise ValueError("model_cfg is required unless init_from names a checkpoint "
                             "(a resumed run passes the model config of its config.json)")
        return model_cfg, None, None
    from tapa.model import loading

    if loading.is_model_dir(train_cfg.init_from):  # a transformers directory (tapa convert / export)
        checkpoint = Path(train_cfg.init_from).expanduser()
        base_cfg = loading.model_dir_config(checkpoint)
    else:
        checkpoint = ckpt.resolve_checkpoint(train_cfg.init_from)
        base_cfg = ModelConfig.from_dict(ckpt.read_state(checkpoint)["model"])
    # the vocabulary follows the tokenizer, checked against the corpus later
    model_cfg = dataclasses.replace(model_cfg or base_cfg, vocab_size=base_cfg.vocab_size)
    check_continual(base_cfg, model_cfg)
    if loading.is_model_dir(checkpoint):
        return model_cfg, checkpoint, loading.model_dir_weights(checkpoint, model_cfg)
    return model_cfg, checkpoint, ckpt.load_weights(checkpoint, model_cfg)


def _prepare_on_rank0(run_dir: Path, train_cfg, model_cfg, data_cfg, corpus, info: DistInfo):
    """prepare_run_dir on rank 0; every rank raises the same error, so none waits forever."""
    outcome = None
    if info.is_main:
        try:
            outcome = ("ok", prepare_run_dir(run_dir, train_cfg, model_cfg, data_cfg, corpus))
        except ValueError as err:
            outcome = ("error", str(err))
    status, value = broadcast_object(outcome, info)
    if status == "error":
        raise ValueError(value)
    return value


@dataclasses.dataclass
class _Run:
    """Everything one training run holds between steps (what `_setup` builds)."""

    train_cfg: TrainConfig
    model_cfg: ModelConfig
    info: DistInfo
    run_dir: Path
    corpus: Corpus
    loader: BatchLoader
    val_windows: object
    plan: dict
    wrapped: torch.nn.Module
    optimizer: torch.optim.Optimizer
    micro: int
    grad_accum: int
    autocast: object
    cp: ContextParallel | None  # the (data x context) mesh when cp > 1
    data_rank: int  # this rank's data-parallel group, of data_groups (rank and world size without CP)
    data_groups: int
    n_params: int
    start_step: int
    loss_window: dict
    log: MetricsLog | None


def _setup(train_cfg: TrainConfig, model_cfg: ModelConfig | None, data_cfg: DataConfig,
           info: DistInfo) -> _Run:
    """The data, the run directory, the model (wrapped for the parallel mode), the optimizer and
    the state a resumed run restores; rank 0 writes config.json."""
    mode = resolve_parallel(train_cfg.parallel, info)
    device = info.device
    cp = None
    if train_cfg.cp > 1:
        if not info.active or info.world_size % train_cfg.cp:
            raise ValueError(f"--cp {train_cfg.cp} needs a multiple of {train_cfg.cp} processes "
                             f"under torchrun (--nproc-per-node), got {info.world_size}")
        cp = ContextParallel(train_cfg.cp, device.type)
    data_rank, data_groups = (cp.dp_rank, cp.dp) if cp is not None else (info.rank, info.world_size)
    micro, grad_accum = _micro_batch_size(train_cfg, data_groups)
    bf16 = train_cfg.precision == "bf16" or (train_cfg.precision == "auto" and device.type == "cuda")

    model_cfg, init_checkpoint, init_weights = _continual_start(train_cfg, model_cfg)
    model_cfg = ModelConfig.from_dict(model_cfg.to_dict())  # our own copy
    check_checkpoint_blocks(train_cfg, model_cfg.n_layers)
    corpus = _load_corpus(data_cfg, info, train_cfg.progress and info.is_main)
    if init_checkpoint is not None and not is_model_dir(init_checkpoint):  # a model dir: its own tokenizer
        check_same_tokenizer(init_checkpoint, corpus)
    if model_cfg.vocab_size != corpus.vocab_size:
        if init_checkpoint is not None:
            raise ValueError(f"the corpus' tokenizer has {corpus.vocab_size} tokens but the "
                             f"checkpoint {str(init_checkpoint)!r} has vocab_size "
                             f"{model_cfg.vocab_size}; continue on data with the same tokenizer")
        model_cfg = dataclasses.replace(model_cfg, vocab_size=corpus.vocab_size)
    loader = BatchLoader(corpus.tokens("train"), seq_len=train_cfg.seq_len,
                         batch_size=train_cfg.batch_size, seed=train_cfg.seed, rank=data_rank,
                         world_size=data_groups, passkey_fraction=train_cfg.passkey_fraction,
                         encode=corpus.encode if train_cfg.passkey_fraction > 0 else None)
    val_windows = validation_windows(corpus.tokens("val"), train_cfg.seq_len,
                                     train_cfg.eval_batches * train_cfg.batch_size)
    plan = data_plan(len(corpus.tokens("train")), loader.sampler.windows_per_epoch, train_cfg)

    run_dir = Path(train_cfg.run_dir) if train_cfg.run_dir else default_run_dir(train_cfg, model_cfg)
    resume_from, note = _prepare_on_rank0(run_dir, train_cfg, model_cfg, data_cfg, corpus, info)
    if info.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        if note:
            print(f"tapa train: {note}", flush=True)

    torch.manual_seed(train_cfg.seed)  # same initial weights on every rank and device
    model = TapaLM(model_cfg)
    model.checkpoint_blocks = ((train_cfg.checkpoint_blocks or True) if train_cfg.activation_checkpointing
                               else False)
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
    if model_cfg.has_tapa_layers and not any(is_phase_parameter(name) for name, _ in wrapped.named_parameters()):
        raise RuntimeError("the model has TAPA layers but tapa.model.is_phase_parameter matched "
                           "none of its parameter names: phase_lr_scale would be ignored")

    start_step, loss_window = 0, {"loss_sum": 0.0, "steps": 0}
    if resume_from is not None:
        lr_scales = [group["lr_scale"] for group in optimizer.param_groups]
        state = ckpt.load_training_state(resume_from, model=wrapped, optimizer=optimizer,
                                         model_cfg=model_cfg, info=info)
        for group, lr_scale in zip(optimizer.param_groups, lr_scales):  # not the checkpoint's copy
            group["lr_scale"] = lr_scale
        start_step = state["step"]
        loss_window = state.get("loss_window", loss_window)

    log = None
    if info.is_main:
        previous = read_run_config(run_dir) if resume_from else {}
        run_config = {
            "model": model_cfg.to_dict(), "data": data_cfg.to_dict(), "train": train_cfg.to_dict(),
            "corpus": corpus.manifest, "data_plan": plan, "num_parameters": n_params,
            "world_size": info.world_size, "parallel": mode, "context_parallel": train_cfg.cp,
            "precision": "bf16" if bf16 else "fp32",
            "device": str(device),
            "init_from": (str(init_checkpoint) if init_checkpoint is not None
                          else previous.get("init_from")),
            "torch_version": torch.__version__,
        }
        ckpt.write_text_atomic(run_dir / "config.json", json.dumps(run_config, indent=2, default=str))
        log = MetricsLog(run_dir, train_cfg, resume_step=start_step if resume_from else None)
        if train_cfg.progress:
            print(f"corpus: {plan['train_tokens']:,} training tokens; this run reads "
                  f"{plan['run_tokens']:,} tokens ({train_cfg.steps} steps x "
                  f"{plan['tokens_per_step']:,}) = {plan['epochs']:.2f} epochs", flush=True)
    autocast = (torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else nullcontext())
    return _Run(train_cfg, model_cfg, info, run_dir, corpus, loader, val_windows, plan, wrapped,
                optimizer, micro, grad_accum, autocast, cp, data_rank, data_groups, n_params,
                start_step, loss_window, log)


def _forward_loss(run: _Run, batch: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy (float32) of a (rows, seq_len + 1) batch of token windows;
    under CP this rank scores its share of the rows, and the loss is the mean over every rank's
    tokens (the same on every rank)."""
    inputs, targets = batch[:, :-1], batch[:, 1:]
    documents = (Documents.from_tokens(inputs, run.corpus.eot_id) if run.train_cfg.doc_mask
                 else None)
    if run.cp is not None:  # the whole rows' documents go with the shard
        inputs, targets, shard = run.cp.shard(inputs, targets, documents=documents)
        with run.autocast:
            return run.wrapped(inputs, targets=targets, context_parallel=shard)
    with run.autocast:
        return run.wrapped(inputs, document_ids=documents, targets=targets)


def _step(run: _Run, step: int) -> tuple[torch.Tensor, torch.Tensor, float]:
    """One optimizer step: (loss, gradient norm, lr), the loss the mean over its micro-batches."""
    lr = lr_at(step, run.train_cfg)
    set_lr(run.optimizer, lr)
    batch = torch.from_numpy(run.loader.batch(step)).to(run.info.device, non_blocking=True)
    step_loss = torch.zeros((), device=run.info.device)
    for index, chunk in enumerate(batch.split(run.micro)):
        with gradient_sync(run.wrapped, sync=index == run.grad_accum - 1):
            loss = _forward_loss(run, chunk)
            (loss / run.grad_accum).backward()
        step_loss += loss.detach() / run.grad_accum
    max_norm = run.train_cfg.grad_clip if run.train_cfg.grad_clip > 0 else float("inf")
    grad_norm = torch.nn.utils.clip_grad_norm_(run.wrapped.parameters(), max_norm)
    run.optimizer.step()
    run.optimizer.zero_grad(set_to_none=True)
    return step_loss, grad_norm, lr


def _evaluate(run: _Run) -> float:
    """Mean validation loss over the fixed validation windows, shared across ranks."""
    run.wrapped.eval()
    share = len(run.val_windows) // run.data_groups
    mine = torch.from_numpy(run.val_windows[run.data_rank * share:(run.data_rank + 1) * share])
    total = torch.zeros((), device=run.info.device)
    with torch.no_grad():
        for chunk in mine.split(run.micro):
            total += _forward_loss(run, chunk.to(run.info.device)) * len(chunk)
    run.wrapped.train()
    return mean_across_ranks(total / share, run.info).item()


def _save(run: _Run, step: int, loss_sum: torch.Tensor, window_steps: int) -> None:
    window = {"loss_sum": mean_across_ranks(loss_sum, run.info).item(), "steps": window_steps}
    cfg = run.train_cfg
    ckpt.save_checkpoint(run.run_dir, step=step, model=run.wrapped, optimizer=run.optimizer,
                         model_cfg=run.model_cfg, info=run.info, keep=cfg.keep_checkpoints,
                         extra={"tokens": step * run.plan["tokens_per_step"],
                                "samples": step * cfg.batch_size, "seed": cfg.seed,
                                "loss_window": window, "train": cfg.to_dict()})


class _Progress:
    """The training loop's progress: a tqdm bar on a terminal (tqdm's own check, as the corpus build
    and the evaluations use); elsewhere (a log file, a pipe, CI) a plain stderr line at a logged
    step at most every `every` seconds, and at the last step."""

    every = 30.0

    def __init__(self, total: int, initial: int, desc: str):
        from tapa._optional import require

        self.total, self.desc = total, desc
        self.bar = require("tqdm").tqdm(total=total, initial=initial, unit="step", desc=desc,
                                        dynamic_ncols=True, disable=None)  # None: off a terminal
        self.last_line = time.perf_counter()

    def note(self, values: dict, step: int, last: bool) -> None:
        if not self.bar.disable:
            self.bar.set_postfix(values)
            return
        now = time.perf_counter()
        if last or now - self.last_line >= self.every:
            shown = ", ".join(f"{key} {value}" for key, value in values.items())
            print(f"{self.desc}: step {step}/{self.total}, {shown}", file=sys.stderr, flush=True)
            self.last_line = now

    def update(self) -> None:
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()


def _train(train_cfg: TrainConfig, model_cfg: ModelConfig | None, data_cfg: DataConfig,
           info: DistInfo) -> Path:
    run = _setup(train_cfg, model_cfg, data_cfg, info)
    show = train_cfg.progress and info.is_main
    end_step = min(train_cfg.steps, train_cfg.stop_after or train_cfg.steps)
    tokens_per_step = run.plan["tokens_per_step"]
    # the mean training loss since the last scheduled record; its sum is rank-averaged when saved
    loss_sum = torch.full((), float(run.loss_window["loss_sum"]), device=info.device)
    window_steps = int(run.loss_window["steps"])
    guard = _FiniteGuard(info.device, info)

    progress = None
    if show:
        progress = _Progress(train_cfg.steps, run.start_step, f"train {run.model_cfg.pe} L={train_cfg.seq_len}")
    run.wrapped.train()
    # a resumed run's clock continues from its last record
    records = run.log.records if run.log is not None else []
    elapsed_before = records[-1]["elapsed_s"] if records else 0.0
    timed_steps, last_time = 0, time.perf_counter()
    started = last_time - elapsed_before
    for step in range(run.start_step, end_step):
        step_loss, grad_norm, lr = _step(run, step)
        guard.observe(step + 1, step_loss, grad_norm)
        loss_sum += step_loss
        window_steps += 1
        timed_steps += 1
        done = step + 1

        last = done == end_step
        scheduled = is_scheduled_log(done, train_cfg)
        evaluate_now = last or (train_cfg.eval_every and done % train_cfg.eval_every == 0)
        if scheduled or last:  # a stop off the schedule logs too, but keeps the loss window
            guard.check(train_cfg)
            mean_loss = mean_across_ranks(loss_sum / window_steps, info).item()
            if hasattr(grad_norm, "full_tensor"):  # FSDP2 returns a DTensor
                grad_norm = grad_norm.full_tensor()
            now = time.perf_counter()  # the .item() above waited for the GPU
            tokens_per_s = timed_steps * tokens_per_step / (now - last_time)
            val_loss = _evaluate(run) if evaluate_now else None
            if val_loss is not None and not math.isfinite(val_loss):  # never logged, never saved
                raise NonFiniteError(
                    f"training stopped: the validation loss is not finite ({val_loss}) at step {done}; "
                    "no checkpoint of this step was written. Resume from the last checkpoint with a "
                    "lower --lr or a longer --warmup-steps")
            record = {"step": done, "tokens": done * tokens_per_step,
                      "epochs": done * train_cfg.batch_size / run.loader.sampler.windows_per_epoch,
                      "loss": mean_loss, "lr": lr, "grad_norm": float(grad_norm),
                      "tokens_per_s": tokens_per_s, "val_loss": val_loss,
                      "elapsed_s": time.perf_counter() - started}
            if run.log is not None:
                run.log.append(record)
            if progress is not None:
                postfix = {"loss": f"{mean_loss:.3f}", "tok/s": f"{record['tokens_per_s']:.0f}"}
                if val_loss is not None:
                    postfix["val"] = f"{val_loss:.3f}"
                progress.note(postfix, done, last)
            if scheduled:
                loss_sum.zero_()
                window_steps = 0
            timed_steps, last_time = 0, time.perf_counter()  # eval time is not training time
        if progress is not None:
            progress.update()
        if last or (train_cfg.save_every and done % train_cfg.save_every == 0):
            guard.check(train_cfg)
            _save(run, done, loss_sum, window_steps)
    if progress is not None:
        progress.close()
    if run.log is not None and train_cfg.plot and run.log.records:
        plot_losses(run.log.records, run.run_dir / "loss.png",
                    f"{train_cfg.name}: {run.model_cfg.pe}, seq_len {train_cfg.seq_len}, "
                    f"{run.n_params / 1e6:.1f}M parameters, {run.plan['run_tokens'] / 1e6:.1f}M tokens")
    barrier(info)
    return run.run_dir
