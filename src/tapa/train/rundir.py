"""The run directory around the training loop: what a start or a resume finds there and accepts,
the metrics log, and the loss-curve plot.

    RUN/config.json                        model, data and train configs, corpus manifest, data plan
    RUN/metrics.jsonl, RUN/metrics.csv     one record per logged step (rank 0 writes)
    RUN/checkpoints/                       see tapa.train.saving
    RUN/.tapa-run.lock                     pid and host of the `tapa train` writing the run (RunLock)

One run directory is one run: `tapa train` holds an exclusive flock on RUN/.tapa-run.lock from
before it writes anything until it exits, so a second trainer (or a --resume) beside a live run
stops at once, naming it. The kernel drops the lock when its process dies, however it dies; the
next trainer takes it over with a note. (flock is per host on some network filesystems: two
hosts training into one NFS directory are not caught.)
"""

from __future__ import annotations

import csv
import datetime
import json
import math
import os
import socket
import warnings
from pathlib import Path

from tapa._paths import RUN_LOCK
from tapa.data import Corpus, DataConfig
from tapa.model import ModelConfig
from tapa.train import saving as ckpt
from tapa.train.config import RESUME_MUTABLE, TrainConfig, config_differences

METRIC_FIELDS = ("step", "tokens", "loss", "lr", "grad_norm", "tokens_per_s", "val_loss", "elapsed_s",
                 "epochs")
# data settings that change which tokens a run sees (cache_dir only says where they are stored)
DATA_IGNORED_ON_RESUME = ("cache_dir",)
RUN_CONFIG = "config.json"


class RunLocked(ValueError):
    """Another process is writing this run directory."""


class RunLock:
    """An exclusive flock on RUN/.tapa-run.lock, which holds the pid, host and start time of its
    holder. `acquire` raises RunLocked (one line naming the live process) if another process holds
    it; a lock file left by a process that died is taken over, and `note` says so. Released by
    `release`, or by the kernel when the process ends."""

    def __init__(self, run_dir: str | os.PathLike):
        self.path = Path(run_dir) / RUN_LOCK
        self.handle = None
        self.note: str | None = None

    def acquire(self) -> "RunLock":
        import fcntl

        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(self.path, "a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.seek(0)
            holder = _describe_holder(handle.read())
            handle.close()
            raise RunLocked(f"run directory {str(self.path.parent)!r} is in use by {holder}; wait for it "
                            "to end (or stop it), or choose another --run-dir") from None
        handle.seek(0)
        previous = handle.read().strip()
        if previous:  # the holder ended without releasing: killed
            self.note = (f"took over the lock of {_describe_holder(previous)}, which is no longer "
                         "running")
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                 "started": datetime.datetime.now().isoformat(timespec="seconds")}) + "\n")
        handle.flush()
        self.handle = handle
        return self

    def release(self) -> None:
        if self.handle is None:
            return
        import fcntl

        self.handle.seek(0)
        self.handle.truncate()  # an empty file: released cleanly
        self.handle.flush()
        fcntl.flock(self.handle, fcntl.LOCK_UN)
        self.handle.close()
        self.handle = None

    def __enter__(self) -> "RunLock":
        return self.acquire() if self.handle is None else self

    def __exit__(self, *exc) -> None:
        self.release()


def _describe_holder(text: str) -> str:
    try:
        holder = json.loads(text)
        return (f"tapa train (pid {holder['pid']} on {holder['host']}, started {holder['started']})")
    except (ValueError, KeyError, TypeError):
        return "another tapa train"


def check_resume_data(run_dir: Path, data_cfg: DataConfig) -> None:
    """--resume: the data settings must be the run's (what a new cache would be built for); checked
    before the corpus is built, so a wrong flag costs no tokenization."""
    saved = read_run_config(run_dir)
    try:
        saved_data = DataConfig.from_dict(saved["data"]).to_dict()
    except (KeyError, TypeError) as err:
        raise ckpt.CheckpointError(f"{str(Path(run_dir) / RUN_CONFIG)!r} lacks the data config "
                                   f"({err!r})") from err
    problems = [f"data.{d}" for d in config_differences(saved_data, data_cfg.to_dict(),
                                                        DATA_IGNORED_ON_RESUME)]
    if problems:
        raise ValueError(f"--resume: the requested config differs from the run in "
                         f"{str(run_dir)!r}: {problems}")


def read_run_config(run_dir: Path) -> dict:
    """RUN/config.json; a clear error naming the file if it is unreadable or truncated."""
    path = Path(run_dir) / RUN_CONFIG
    try:
        return ckpt.read_json(path, "run config")
    except ckpt.CheckpointError as err:
        raise ckpt.CheckpointError(
            f"{err}. The run cannot be resumed without it; continue from its weights in a new run "
            f"instead: tapa train --init-from {Path(run_dir)} --run-dir NEW_DIR") from err


def read_metrics(path: Path) -> list[dict]:
    """The records of a metrics.jsonl. A partial last line (a write cut short by a kill) is dropped
    with a warning; an unreadable line before it is an error naming the file and line."""
    lines = Path(path).read_text().splitlines()
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as err:
            if number == len(lines):
                warnings.warn(f"{str(path)!r}: dropped its partial last line (line {number})",
                              stacklevel=2)
                break
            raise ckpt.CheckpointError(f"{str(path)!r} line {number} is not a JSON record "
                                       f"({err.msg}); delete or repair that line") from err
    return records


def is_scheduled_log(step: int, cfg: TrainConfig) -> bool:
    """Whether the schedule logs a record after `step` (not counting a stop at stop_after)."""
    return (step % cfg.log_every == 0 or step == cfg.steps
            or bool(cfg.eval_every and step % cfg.eval_every == 0))


class MetricsLog:
    """metrics.jsonl + metrics.csv in the run dir (rank 0). On resume from the checkpoint of step
    `resume_step`, later records are dropped, and so is a record at that step that only marked an
    interruption (stop_after off the log schedule), so the log continues the run exactly once and
    reads as if the run had never stopped."""

    def __init__(self, run_dir: Path, cfg: TrainConfig, *, resume_step: int | None):
        self.jsonl = run_dir / "metrics.jsonl"
        self.csv = run_dir / "metrics.csv"
        records = []
        if resume_step is not None and self.jsonl.exists():
            records = [r for r in read_metrics(self.jsonl) if r["step"] < resume_step
                       or (r["step"] == resume_step and is_scheduled_log(resume_step, cfg))]
        ckpt.write_text_atomic(self.jsonl, "".join(json.dumps(r) + "\n" for r in records))
        with open(self.csv, "w", newline="") as handle:
            writer = csv.DictWriter(handle, METRIC_FIELDS)
            writer.writeheader()
            writer.writerows({k: r.get(k) for k in METRIC_FIELDS} for r in records)
        self.records = records

    def append(self, record: dict) -> None:
        bad = [key for key, value in record.items() if isinstance(value, float) and not math.isfinite(value)]
        if bad:  # the trainer stops before this; a record never holds NaN
            raise ValueError(f"step {record.get('step')}: {', '.join(f'{k}={record[k]}' for k in bad)} "
                             "is not finite; the run stopped without logging it")
        self.records.append(record)
        with open(self.jsonl, "a") as handle:
            handle.write(json.dumps(record) + "\n")
        with open(self.csv, "a", newline="") as handle:
            csv.DictWriter(handle, METRIC_FIELDS).writerow({k: record.get(k) for k in METRIC_FIELDS})


def _saved_configs(saved: dict, run_dir: Path) -> tuple[dict, dict, dict]:
    """The saved model, data and train configs as dicts, through the dataclasses so that fields
    added since the run was saved take their defaults."""
    try:
        return (ModelConfig.from_dict(saved["model"]).to_dict(),
                DataConfig.from_dict(saved["data"]).to_dict(),
                TrainConfig.from_saved(saved["train"]).to_dict())
    except (KeyError, TypeError) as err:
        raise ckpt.CheckpointError(f"{str(Path(run_dir) / RUN_CONFIG)!r} lacks the model, data or "
                                   f"train config ({err!r})") from err


def _check_same_run(run_dir: Path, train_cfg: TrainConfig, model_cfg: ModelConfig,
                    data_cfg: DataConfig, corpus: Corpus) -> None:
    saved = read_run_config(run_dir)
    saved_model, saved_data, saved_train = _saved_configs(saved, run_dir)
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


def prepare_run_dir(run_dir: Path, train_cfg: TrainConfig, model_cfg: ModelConfig,
                    data_cfg: DataConfig, corpus: Corpus) -> tuple[Path | None, str | None]:
    """Check the run directory against the request: (checkpoint to resume from or None, a note
    for the user or None). Removes what an interrupted checkpoint write left behind.

    A directory whose run stopped before its first checkpoint holds nothing to continue: it may be
    started again, with or without --resume."""
    run_dir = Path(run_dir)
    removed = ckpt.remove_partial_checkpoints(run_dir)
    notes = [f"removed {len(removed)} partial checkpoint(s) of an interrupted write"] if removed else []
    started = (run_dir / RUN_CONFIG).exists()
    has_checkpoint = ckpt.has_checkpoint(run_dir)
    if not train_cfg.resume:
        if has_checkpoint:
            raise ValueError(f"run directory {str(run_dir)!r} already holds a run; pass --resume to "
                             "continue it, or choose another --run-dir")
        if started:
            notes.append(f"{str(run_dir)!r} holds a run that stopped before its first checkpoint; "
                         "starting it again (its config and metrics are replaced)")
        return None, "; ".join(notes) or None
    if not has_checkpoint:
        if not started:
            raise ValueError(f"--resume: run directory {str(run_dir)!r} has no checkpoint "
                             "(checkpoints/latest) to resume from")
        _check_same_run(run_dir, train_cfg, model_cfg, data_cfg, corpus)
        notes.append(f"--resume: {str(run_dir)!r} stopped before its first checkpoint; "
                     "starting it again from step 0")
        return None, "; ".join(notes)
    _check_same_run(run_dir, train_cfg, model_cfg, data_cfg, corpus)
    checkpoint = ckpt.resolve_checkpoint(run_dir)
    step = ckpt.read_state(checkpoint, verify=False)["step"]
    for name in ("steps", "stop_after"):
        value = getattr(train_cfg, name)
        if value is not None and value < step:
            raise ValueError(f"--resume: the latest checkpoint {str(checkpoint)!r} is at step {step}, "
                             f"past --{name.replace('_', '-')} {value}; pass a value >= {step}")
    return checkpoint, "; ".join(notes) or None


def check_same_tokenizer(checkpoint: Path, corpus: Corpus) -> None:
    """Continual pretraining must read token ids the checkpoint was trained on."""
    saved = (ckpt.run_config(checkpoint).get("corpus") or {}).get("tokenizer", {}).get("sha256")
    current = (corpus.manifest or {}).get("tokenizer", {}).get("sha256")
    if saved and current and saved != current:
        raise ValueError(f"the corpus' tokenizer (sha256 {current[:12]}) is not the one "
                         f"{str(checkpoint)!r} was trained with ({saved[:12]}); continue with the "
                         "same data settings, or pass --tokenizer with the original tokenizer dir")


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
    ax.set_ylabel("cross-entropy (nats/token), lower is better")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
