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
import typing
from pathlib import Path

from tapa.data import DataConfig
from tapa.model import PE_CHOICES, PHASE_MATRICES, ModelConfig
from tapa.ops import DISTANCES, IMPLS
from tapa.train.config import (PARALLEL_MODES, PRECISIONS, TrainConfig, available_recipes,
                               build_configs, continual_model_config, default_run_dir, load_recipe)

# section -> {field: flag}, flags that differ from the field name
_RENAMED = {"data": {"source": "data"}}
# fields that are not flags: the model's vocabulary follows the tokenizer (--vocab-size)
_HIDDEN = {"model": {"vocab_size"}}
_SECTIONS = {"model": ModelConfig, "data": DataConfig, "train": TrainConfig}
_CHOICES = {"pe": list(PE_CHOICES), "distance": DISTANCES, "phase_matrix": PHASE_MATRICES,
            "attn_impl": IMPLS, "precision": PRECISIONS, "parallel": PARALLEL_MODES}


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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--recipe", default=None,
                        help="recipe name (see --list-recipes) or path to a .toml file "
                             "(default: tiny, or the run's own config with --resume)")
    parser.add_argument("--list-recipes", action="store_true", help="print the recipe names and exit")
    parser.add_argument("--print-config", action="store_true",
                        help="print the merged configs as JSON and exit")
    parser.add_argument("--data-only", action="store_true",
                        help="build (or find) the run's data cache and exit; run this once before "
                             "torchrun so no process waits on a long tokenization")
    groups = {section: parser.add_argument_group(
        f"{section} ({cls.__name__}; defaults shown are the dataclass's, a recipe may set others)")
        for section, cls in _SECTIONS.items()}
    defaults = {section: {f.name: f.default for f in dataclasses.fields(cls)}
                for section, cls in _SECTIONS.items()}
    for dest, (section, field, scalar, optional) in _flag_fields().items():
        flag = "--" + dest.replace("_", "-")
        default = defaults[section][field]
        shown = "" if default is dataclasses.MISSING else f" (default {default})"
        if scalar is bool:
            groups[section].add_argument(flag, dest=dest, action=argparse.BooleanOptionalAction,
                                         default=argparse.SUPPRESS, help=f"{section}.{field}{shown}")
        elif field in _CHOICES:
            groups[section].add_argument(flag, dest=dest, choices=_CHOICES[field],
                                         default=argparse.SUPPRESS, help=f"{section}.{field}{shown}")
        else:
            groups[section].add_argument(flag, dest=dest, type=_parser_for(scalar, optional),
                                         default=argparse.SUPPRESS, metavar=scalar.__name__.upper(),
                                         help=f"{section}.{field}{shown}")


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
    the recipe's and flags' model values applied where continual pretraining allows.
    """
    overrides = overrides_from_args(args)
    recipe = load_recipe(args.recipe or "tiny")
    if overrides["train"].get("resume"):
        run_dir = overrides["train"].get("run_dir")
        if run_dir is None:
            train_cfg, model_cfg, _ = build_configs(recipe, overrides)
            run_dir = str(train_cfg.run_dir or default_run_dir(train_cfg, model_cfg))
        saved_path = Path(run_dir) / "config.json"
        if not saved_path.is_file():
            raise SystemExit(f"tapa train --resume: {str(saved_path)!r} not found; "
                             "pass the run's --run-dir")
        saved = json.loads(saved_path.read_text())
        merged = {section: {**saved[section], **overrides[section]} for section in _SECTIONS}
        merged["train"]["run_dir"] = run_dir
        # an interruption point is not part of the run: resume to the end unless asked again
        merged["train"]["stop_after"] = overrides["train"].get("stop_after")
        return build_configs(None, merged)
    if overrides["train"].get("init_from"):
        from tapa.train.checkpoint import read_state, resolve_checkpoint

        base = ModelConfig.from_dict(read_state(resolve_checkpoint(overrides["train"]["init_from"]),
                                                verify=False)["model"])
        requested = {**recipe["model"], **overrides["model"]}
        model_cfg = continual_model_config(base, requested)
        train_cfg, _, data_cfg = build_configs(recipe, overrides)
        return train_cfg, model_cfg, data_cfg
    return build_configs(recipe, overrides)


def run(args: argparse.Namespace) -> int:
    if args.list_recipes:
        print("\n".join(available_recipes()))
        return 0
    try:
        train_cfg, model_cfg, data_cfg = configs_from_args(args)
    except ValueError as err:
        raise SystemExit(f"tapa train: {err}") from err
    if args.print_config:
        print(json.dumps({"model": model_cfg.to_dict(), "data": data_cfg.to_dict(),
                          "train": train_cfg.to_dict()}, indent=2))
        return 0
    if args.data_only:
        from tapa.data import build_corpus

        corpus = build_corpus(data_cfg, progress=train_cfg.progress)
        sizes = ", ".join(f"{split} {len(corpus.tokens(split)):,}" for split in ("train", "val", "test"))
        print(f"data cache: {corpus.directory} (vocab {corpus.vocab_size}; tokens: {sizes})")
        return 0
    from tapa.train.trainer import train

    try:
        run_dir = train(train_cfg, model_cfg, data_cfg)
    except ValueError as err:  # bad input (including CheckpointError): a message, not a traceback
        raise SystemExit(f"tapa train: {err}") from err
    metrics = run_dir / "metrics.jsonl"
    if metrics.is_file() and int(os.environ.get("RANK", "0")) == 0:
        records = [json.loads(line) for line in metrics.read_text().splitlines() if line]
        if records:
            first, last = records[0], records[-1]
            overall = last["tokens"] / last["elapsed_s"] if last["elapsed_s"] else float("nan")
            print(f"run: {run_dir}\nsteps {last['step']}: loss {first['loss']:.3f} -> "
                  f"{last['loss']:.3f}, val_loss {last['val_loss']}, {overall:.0f} tokens/s "
                  f"overall (last interval {last['tokens_per_s']:.0f})")
    return 0
