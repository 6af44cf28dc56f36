"""`tapa train`: pretrain, continue pretraining (--init-from) or resume (--resume) a run.

Every field of ModelConfig, DataConfig and TrainConfig is a flag (underscores become dashes;
DataConfig.source is --data). Precedence: defaults < recipe < flags.

    tapa train --recipe tiny
    tapa train --recipe tiny --pe rope --lr 3e-4 --steps 500
    tapa train --recipe tiny --init-from runs/tiny-tapa-256 --seq-len 512 --steps 100
    tapa train --run-dir runs/tiny-tapa-256 --resume
    torchrun --nproc_per_node 2 -m tapa.cli train --recipe toy-gpu --parallel fsdp
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import typing
from pathlib import Path

from tapa._config import field_help
from tapa.data import DataConfig
from tapa.model import PE_CHOICES, PHASE_MATRICES, ModelConfig
from tapa.ops import DISTANCES, IMPLS
from tapa.train.config import (PARALLEL_MODES, PRECISIONS, TrainConfig, available_recipes,
                               build_configs, continual_model_config, data_slug, default_run_dir, find_recipe,
                               load_recipe, saved_train_values)

# section -> {field: flag}, flags that differ from the field name
_RENAMED = {"data": {"source": "data"}}
# fields that are not flags: the model's vocabulary follows the tokenizer (--vocab-size)
_HIDDEN = {"model": {"vocab_size"}}
_SECTIONS = {"model": ModelConfig, "data": DataConfig, "train": TrainConfig}
_CHOICES = {"pe": list(PE_CHOICES), "distance": DISTANCES, "phase_matrix": PHASE_MATRICES,
            "attn_impl": IMPLS, "precision": PRECISIONS, "parallel": PARALLEL_MODES}
# sentences for fields whose dataclass documents them neither in metadata nor in its docstring
_FALLBACK_HELP = {
    "cache_dir": "where tokenized corpora are cached ($TAPA_CACHE/data or ~/.cache/tapa/data)",
    "vocab_size": "size of the BPE vocabulary trained on the corpus (the model's follows it)",
    "include_site_packages": "builtin source: also read the installed site-packages",
    "text_field": "the text column of a .jsonl or Hugging Face dataset source",
    "val_fraction": "share of the documents held out for validation",
    "test_fraction": "share of the documents held out for testing",
}
# train fields of a continual run's source that describe that run, not how to train
_NOT_INHERITED = ("run_dir", "init_from", "resume", "stop_after")


def _flag_fields() -> dict[str, tuple[str, str, type, bool]]:
    """dest -> (section, field, scalar type, optional) for every config field exposed as a flag."""
    table = {}
    for section, cls in _SECTIONS.items():
        hints = typing.get_type_hints(cls)
        for field in dataclasses.fields(cls):
            if field.name in _HIDDEN.get(section, ()):
                continue
            dest = _RENAMED.get(section, {}).get(field.name, field.name)
            if dest in table:
                raise RuntimeError(f"flag --{dest} is defined by two config sections")
            hint = hints[field.name]
            args = [a for a in typing.get_args(hint) if a is not type(None)]
            optional = bool(typing.get_args(hint)) and type(None) in typing.get_args(hint)
            table[dest] = (section, field.name, args[0] if args else hint, optional)
    return table


def _parser_for(scalar: type, optional: bool):
    def parse(text: str):
        if optional and text.lower() in ("none", "null", ""):
            return None
        return scalar(text)
    parse.__name__ = scalar.__name__  # argparse names the type in its error messages
    return parse


def _default_of(field: dataclasses.Field):
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return field.default


def _flag_help(section: str, field: dataclasses.Field) -> str:
    cls = _SECTIONS[section]
    text = (field_help(field, cls.__doc__) or _FALLBACK_HELP.get(field.name)
            or f"{cls.__name__}.{field.name}")
    default = _default_of(field)
    shown = "" if default is dataclasses.MISSING else f" (default: {default})"
    return (text + shown).replace("%", "%%")  # argparse formats help with %


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--recipe", default=None,
                        help="recipe name (see --list-recipes) or path to a .toml file "
                             "(default: tiny; with --resume the run's own config, with "
                             "--init-from the source run's config)")
    parser.add_argument("--list-recipes", action="store_true",
                        help="print each recipe's name, size and purpose, and exit")
    parser.add_argument("--print-config", action="store_true",
                        help="print the merged configs as JSON and exit")
    parser.add_argument("--data-only", action="store_true",
                        help="build (or find) the run's data cache and exit; run this once before "
                             "torchrun so no process waits on a long tokenization")
    parser.add_argument("--skip-memory-check", action="store_true",
                        help="start even when the memory estimate (activations, weights and "
                             "optimizer state) exceeds the device's memory")
    groups = {section: parser.add_argument_group(
        f"{section} ({cls.__name__}; defaults shown are the dataclass's, a recipe (tiny unless "
        "--recipe) may set others)")
        for section, cls in _SECTIONS.items()}
    fields = {section: {f.name: f for f in dataclasses.fields(cls)}
              for section, cls in _SECTIONS.items()}
    for dest, (section, name, scalar, optional) in _flag_fields().items():
        flag = "--" + dest.replace("_", "-")
        help_ = _flag_help(section, fields[section][name])
        if scalar is bool:
            groups[section].add_argument(flag, dest=dest, action=argparse.BooleanOptionalAction,
                                         default=argparse.SUPPRESS, help=help_)
        elif name in _CHOICES:
            groups[section].add_argument(flag, dest=dest, choices=_CHOICES[name],
                                         default=argparse.SUPPRESS, help=help_)
        else:
            groups[section].add_argument(flag, dest=dest, type=_parser_for(scalar, optional),
                                         default=argparse.SUPPRESS, metavar=scalar.__name__.upper(),
                                         help=help_)


def overrides_from_args(args: argparse.Namespace) -> dict[str, dict]:
    """{"model": {...}, "data": {...}, "train": {...}} of the flags given on the command line."""
    overrides = {section: {} for section in _SECTIONS}
    for dest, (section, field, _, _) in _flag_fields().items():
        if hasattr(args, dest):
            overrides[section][field] = getattr(args, dest)
    return overrides


def configs_from_args(args: argparse.Namespace):
    """The (TrainConfig, ModelConfig, DataConfig) a command line asks for.

    --resume: the run's saved config.json is the base, and the flags may change only what a
    resume allows (checked by train()). --init-from: the model config is the checkpoint's, with
    the flags' (and an explicit --recipe's) model values applied where continual pretraining
    allows; train and data settings: defaults < the source run's config < --recipe < flags.
    """
    overrides = overrides_from_args(args)
    if overrides["train"].get("resume"):
        configs = _resume_configs(args, overrides)
    elif overrides["train"].get("init_from"):
        configs = _continual_configs(args, overrides)
    else:
        configs = build_configs(load_recipe(args.recipe or "tiny"), overrides)
    _check_local_window_flag(overrides, configs[1])
    return configs


def _check_local_window_flag(overrides: dict, model_cfg) -> None:
    """--local-window, given explicitly, sizes the local layers' window; on a model without a
    local layer it would do nothing. (A recipe may carry a window for all its models; only the
    flag is checked.)"""
    if "local_window" in overrides["model"] and not model_cfg.is_hybrid:
        raise ValueError(f"--local-window sizes local layers, but layer_pattern="
                         f"{model_cfg.layer_pattern!r} has none; add L to --layer-pattern or drop "
                         "--local-window")


def _resume_configs(args: argparse.Namespace, overrides: dict):
    from tapa.train.rundir import read_run_config

    run_dir = overrides["train"].get("run_dir")
    if run_dir is None:
        train_cfg, model_cfg, data_cfg = build_configs(load_recipe(args.recipe or "tiny"), overrides)
        run_dir = str(train_cfg.run_dir or default_run_dir(train_cfg, model_cfg, data_cfg))
    if not (Path(run_dir) / "config.json").is_file():
        raise ValueError(f"--resume: {str(Path(run_dir) / 'config.json')!r} not found; "
                         "pass the run's --run-dir")
    saved = read_run_config(Path(run_dir))
    saved["train"] = saved_train_values(saved.get("train", {}))
    merged = {section: {**saved.get(section, {}), **overrides[section]} for section in _SECTIONS}
    merged["train"]["run_dir"] = run_dir
    # an interruption point is not part of the run: resume to the end unless asked again
    merged["train"]["stop_after"] = overrides["train"].get("stop_after")
    return build_configs(None, merged)


def _continual_configs(args: argparse.Namespace, overrides: dict):
    from tapa.model.loading import (checkpoint_model_config, is_model_dir, read_state, resolve_checkpoint,
                                       run_config)

    init_from = overrides["train"]["init_from"]
    defaults = load_recipe("tiny")
    if is_model_dir(init_from):
        base_model, source, saved_train, source_data = _model_dir_start(init_from, overrides, defaults)
    else:
        checkpoint = resolve_checkpoint(init_from)
        base_model = checkpoint_model_config(checkpoint)
        # the source run's settings: its config.json; a bare checkpoint directory has its train
        # settings in state.json (since phase_lr_scale) and takes the default recipe's for the rest
        source = run_config(checkpoint)
        saved_train = source.get("train") or read_state(checkpoint, verify=False).get("train")
        source_data = source.get("data") or defaults["data"]
    source_train = saved_train_values(saved_train) if saved_train else defaults["train"]
    known = {section: {f.name for f in dataclasses.fields(cls)} for section, cls in _SECTIONS.items()}
    inherited = {
        "data": {k: v for k, v in source_data.items() if k in known["data"]},
        "train": {k: v for k, v in source_train.items()
                  if k in known["train"] and k not in _NOT_INHERITED},
    }
    recipe = load_recipe(args.recipe) if args.recipe else {section: {} for section in _SECTIONS}
    merged = {section: {**inherited.get(section, {}), **recipe[section], **overrides[section]}
              for section in ("data", "train")}
    if "name" in inherited["train"] and "name" not in {**recipe["train"], **overrides["train"]}:
        # runs/<name>-<pe>-<seq_len> of the source must not be the continual run's default
        merged["train"]["name"] = f"{inherited['train']['name']}-continual"
    if is_model_dir(init_from) and "name" not in {**recipe["train"], **overrides["train"]}:
        merged["train"]["name"] = f"{data_slug(str(init_from))}-continual"
    if "lr" not in overrides["train"]:
        # The run starts from the weights alone, with a fresh optimizer: at the pretraining peak lr
        # its first steps undo part of the pretraining (results/toy-study: x1 left every arm 12-14%
        # worse at the pretraining length). Unless --lr says otherwise it continues at the lr where
        # the pretraining schedule ended.
        merged["train"]["lr"] = continual_lr(merged["train"])
    model_cfg = continual_model_config(base_model, {**recipe["model"], **overrides["model"]})
    return TrainConfig.from_dict(merged["train"]), model_cfg, DataConfig.from_dict(merged["data"])


def _model_dir_start(path: str, overrides: dict, defaults: dict):
    """(model config, run config {}, saved train settings None, data settings) of --init-from a
    transformers model directory (tapa convert / tapa export): the text is --data (required), the
    tokenizer the directory's own tokenizer.json (--tokenizer overrides it)."""
    from tapa.model.loading import model_dir_config

    base_model = model_dir_config(path)
    data = dict(defaults["data"])
    if "source" not in overrides["data"]:
        raise ValueError(f"--init-from {path}: a model directory carries no training text; pass --data SOURCE "
                         "(a text file, a directory of files, a .jsonl, hf:NAME)")
    if "tokenizer" not in overrides["data"]:
        if not (Path(path).expanduser() / "tokenizer.json").is_file():
            raise ValueError(f"--init-from {path}: the directory has no tokenizer.json; pass --tokenizer DIR "
                             "(the tokenizer the model was trained with)")
        data["tokenizer"] = str(Path(path).expanduser())
    return base_model, {}, None, data


def continual_lr(train: dict) -> float:
    """A continual run's default peak lr: the pretraining lr x its min_lr_ratio (where its cosine
    schedule ended), from the merged train settings `train` (TrainConfig's defaults where unset)."""
    defaults = TrainConfig()
    return train.get("lr", defaults.lr) * train.get("min_lr_ratio", defaults.min_lr_ratio)


def list_recipes() -> str:
    """One line per recipe: name, parameter count (from its model config) and purpose (the first
    comment line of its TOML file)."""
    import torch

    from tapa.model import TapaLM

    rows = []
    for name in available_recipes():
        path = find_recipe(name)
        try:
            _, model_cfg, data_cfg = build_configs(load_recipe(name))
            model_cfg = dataclasses.replace(model_cfg, vocab_size=data_cfg.vocab_size)
            with torch.device("meta"):
                size = _human(TapaLM(model_cfg).num_parameters())
        except ValueError as err:
            size = f"invalid ({err})"
        comments = [line.lstrip("#").strip() for line in path.read_text().splitlines()
                    if line.startswith("#")]
        purpose = comments[0] if comments else ""
        if purpose.startswith(f"{name}:"):
            purpose = purpose[len(name) + 1:].strip()
        rows.append((name, size, purpose))
    width = max((len(name) for name, _, _ in rows), default=0)
    return "\n".join(f"{name:<{width}}  {size:>6} parameters  {purpose}" for name, size, purpose in rows)


def _human(count: int) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if count >= scale:
            return f"{count / scale:.3g}{unit}"
    return str(count)


def run(args: argparse.Namespace) -> int:
    from tapa.train.trainer import NonFiniteError, NotDeterministicError

    if args.list_recipes:
        print(list_recipes())
        return 0
    try:
        train_cfg, model_cfg, data_cfg = configs_from_args(args)
    except ValueError as err:
        raise SystemExit(f"tapa train: error: {err}") from err
    if train_cfg.init_from and not train_cfg.resume and not hasattr(args, "lr"):  # set by continual_lr
        # beside --print-config on stderr: its stdout is the JSON alone
        print(f"continual run: peak lr {train_cfg.lr:g}, where the pretraining schedule ended "
              f"(its lr x min_lr_ratio); --lr sets another", file=sys.stderr if args.print_config else sys.stdout)
    warmup = warmup_note(train_cfg)
    if args.print_config:
        if warmup:
            print(f"tapa train: note: {warmup}", file=sys.stderr)
        print(json.dumps({"model": model_cfg.to_dict(), "data": data_cfg.to_dict(),
                          "train": train_cfg.to_dict()}, indent=2))
        return 0
    if args.data_only:
        from tapa.data import build_corpus

        corpus = build_corpus(data_cfg, progress=train_cfg.progress)
        sizes = ", ".join(f"{split} {len(corpus.tokens(split)):,}" for split in ("train", "val", "test"))
        print(f"data cache: {corpus.directory} (vocab {corpus.vocab_size}; tokens: {sizes})")
        return 0
    from tapa.train.config import check_checkpoint_blocks, default_run_dir
    from tapa.train.rundir import RunLock, check_resume_data
    from tapa.train.trainer import train

    main_rank = int(os.environ.get("RANK", "0")) == 0
    run_dir = Path(train_cfg.run_dir) if train_cfg.run_dir else default_run_dir(train_cfg, model_cfg, data_cfg)
    train_cfg = dataclasses.replace(train_cfg, run_dir=str(run_dir))  # the trainer's default has no data source
    lock = RunLock(run_dir)
    try:
        # all before the corpus is built and anything is written: each is a one-line error at once
        check_checkpoint_blocks(train_cfg, model_cfg.n_layers)
        check_memory(train_cfg, model_cfg, data_cfg, skip=args.skip_memory_check, show=main_rank)
        if main_rank:  # under torchrun rank 0 holds the lock; torchrun stops the others if it fails
            lock.acquire()
            for note in (lock.note, warmup):
                if note:
                    print(f"tapa train: note: {note}", file=sys.stderr, flush=True)
        if train_cfg.resume:
            check_resume_data(run_dir, data_cfg)
            done = finished_step(run_dir, train_cfg)
            if done is not None:  # nothing to train: say so, instead of the old summary
                if main_rank:
                    print(f"tapa train: {run_dir} is complete: its latest checkpoint is at step {done} of "
                          f"--steps {train_cfg.steps}; nothing to resume (a larger --steps trains it further)")
                return 0
        run_dir = train(train_cfg, model_cfg, data_cfg)  # the lock held throughout
    except (ValueError, NonFiniteError, NotDeterministicError) as err:
        # bad input, CheckpointError, divergence, an op --deterministic can't run: a message
        raise SystemExit(f"tapa train: error: {err}") from err
    finally:
        lock.release()
    if main_rank:
        # the corpus line was printed at the start when the run showed progress
        print(summary(run_dir, corpus=not train_cfg.progress))
    return 0


def finished_step(run_dir: Path, train_cfg) -> int | None:
    """The step of a run's latest checkpoint when it is exactly at --steps (a finished run that
    --resume would only load and save again); None otherwise."""
    from tapa.model.loading import has_checkpoint, read_state, resolve_checkpoint

    if not has_checkpoint(run_dir):
        return None
    step = read_state(resolve_checkpoint(run_dir), verify=False).get("step")
    return step if step == train_cfg.steps else None  # past --steps: prepare_run_dir says it is an error


# Activation memory per token and layer, in values (see estimate_memory). On CUDA, the fused
# kernels under bf16 autocast: the residual stream and the norms' inputs in float32, the rest
# (projections' inputs and outputs, SwiGLU's four ffn-wide tensors) in bf16. On the CPU, float32
# and the reference attention, whose TAPA path keeps phase/amplitude splits and float32 copies:
# measured on the tiny recipe's model (d 128, ffn 384) at 2k-16k tokens, 352 bytes per d for a
# TAPA layer and 193 for a RoPE one.
_CPU_EXTRA_PER_D = {"tapa": 56, "other": 16}


def estimate_memory(train_cfg, model_cfg, vocab_size: int, device_type: str, world_size: int = 1
                    ) -> dict[str, float]:
    """A rough estimate, in bytes, of what one training process holds at its peak: "activations"
    (what the forward of one micro-batch keeps for the backward) and "state" (weights, gradients
    and AdamW's two moments, float32; FSDP shares them across processes)."""
    import dataclasses as _dc

    import torch

    from tapa.model import TapaLM

    cfg = _dc.replace(model_cfg, vocab_size=vocab_size)
    micro = train_cfg.micro_batch_size or max(1, train_cfg.batch_size // world_size)
    tokens = micro * train_cfg.seq_len
    d, ffn = cfg.dim, cfg.ffn_dim
    kv = cfg.n_kv_heads * cfg.head_dim
    per_layer = []
    for layer in range(cfg.n_layers):
        tapa_layer = cfg.layer_kind(layer) == "global" and cfg.family == "tapa"
        if device_type == "cuda":
            per_layer.append(2 * (10 * d + 2 * kv + 4 * ffn) + 4 * 2 * d)
        else:
            extra = _CPU_EXTRA_PER_D["tapa" if tapa_layer else "other"] * d
            per_layer.append(4 * (14 * d + 2 * kv + 4 * ffn + extra))
    if train_cfg.activation_checkpointing:  # recomputed blocks keep their inputs, and one of them
        # is recomputed at a time, after the backward has freed the blocks past checkpoint_blocks
        # (which keep all theirs until then)
        recomputed = train_cfg.checkpoint_blocks or cfg.n_layers
        per_token = 4 * d * recomputed + max(sum(per_layer[recomputed:]), max(per_layer[:recomputed]))
    else:
        per_token = sum(per_layer)
    per_token += 4 * 4 * d  # embedding output, final norm, a chunk of the loss
    with torch.device("meta"):
        n_params = TapaLM(cfg).num_parameters()
    shards = world_size if train_cfg.parallel == "fsdp" else 1
    return {"activations": float(per_token * tokens), "state": 16.0 * n_params / shards,
            "tokens": float(tokens)}


def device_memory(device) -> tuple[float, str]:
    """(bytes, description) of the memory a training process on `device` can use: a GPU's total
    memory, or on the CPU the machine's RAM (or the container's limit, if lower)."""
    import torch

    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        return float(total), f"{device} ({torch.cuda.get_device_name(device)})"
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    what = "this machine's RAM"
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit.isdigit() and int(limit) < total:
            total, what = int(limit), "this container's memory limit"
    except OSError:
        pass
    return float(total), what


def check_memory(train_cfg, model_cfg, data_cfg, *, skip: bool = False, show: bool = True) -> None:
    """Before the first step: ValueError when the memory estimate of one process exceeds its
    device's memory, a warning (stderr) when it exceeds half. The device is checked to exist."""
    from tapa.train.distributed import pick_device

    device = pick_device(train_cfg.device, int(os.environ.get("LOCAL_RANK", "0")))
    vocab = model_cfg.vocab_size if (train_cfg.init_from or train_cfg.resume) else data_cfg.vocab_size
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    estimate = estimate_memory(train_cfg, model_cfg, vocab, device.type, world_size)
    total, where = device_memory(device)
    need = estimate["activations"] + estimate["state"]
    gib = 2.0 ** 30
    shape = (f"{int(estimate['tokens']) // train_cfg.seq_len} x {train_cfg.seq_len} tokens per micro-batch")
    detail = (f"about {need / gib:.1f} GiB ({estimate['activations'] / gib:.1f} GiB of activations for "
              f"{shape}, {estimate['state'] / gib:.1f} GiB of weights and optimizer state)")
    hint = ("lower --seq-len, --batch-size or --micro-batch-size, or add --activation-checkpointing")
    if need > total and not skip:
        raise ValueError(f"this run needs {detail}, more than the {total / gib:.1f} GiB of {where}; "
                         f"{hint} (--skip-memory-check starts it anyway)")
    if need > total / 2 and show:
        print(f"tapa train: warning: this run needs {detail}, more than half of the {total / gib:.1f} GiB "
              f"of {where}; if it runs out of memory, {hint}", file=sys.stderr, flush=True)


def warmup_note(train_cfg) -> str | None:
    """A note when the warmup outlasts the run, so that the lr never reaches its peak (else None)."""
    from tapa.train.trainer import lr_at

    if train_cfg.warmup_steps <= train_cfg.steps:
        return None
    return (f"--warmup-steps {train_cfg.warmup_steps} is longer than --steps {train_cfg.steps}: the lr rises to "
            f"{lr_at(train_cfg.steps - 1, train_cfg):g} and never reaches its peak {train_cfg.lr:g} "
            "(lower --warmup-steps)")


def summary(run_dir: Path, *, corpus: bool = True) -> str:
    """What a finished run reports: its directory, loss, throughput and (corpus) data plan."""
    from tapa.train.rundir import read_metrics, read_run_config

    lines = [f"run: {run_dir}"]
    metrics = run_dir / "metrics.jsonl"
    records = read_metrics(metrics) if metrics.is_file() else []
    if records:
        first, last = records[0], records[-1]
        overall = last["tokens"] / last["elapsed_s"] if last["elapsed_s"] else float("nan")
        # one logged step has no "from": "loss 5.908 -> 5.908" read as if nothing trained
        loss = (f"loss {first['loss']:.3f} -> {last['loss']:.3f}" if len(records) > 1
                else f"loss {last['loss']:.3f} at step {last['step']}")
        lines.append(f"steps {last['step']}: {loss}, "
                     f"val_loss {_loss(last.get('val_loss'))}, {overall:.0f} tokens/s overall "
                     f"(last interval {last['tokens_per_s']:.0f})")
    plan = read_run_config(run_dir).get("data_plan")
    if plan and corpus:
        lines.append(f"corpus: {plan['train_tokens']:,} training tokens; the run reads "
                     f"{plan['run_tokens']:,} tokens = {plan['epochs']:.2f} epochs")
    return "\n".join(lines)


def _loss(value) -> str:
    return f"{value:.3f}" if isinstance(value, (int, float)) else "n/a"
