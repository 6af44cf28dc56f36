"""`tapa eval RUN_DIR [RUN_DIR...]`: perplexity vs length (and passkey retrieval) for trained runs.
Writes RUN_DIR/eval/{results.json, results.md, perplexity.png, position_loss.png, passkey_*.png}.
A directory that holds run directories (what `tapa demo` writes) stands for the runs inside it."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tapa._paths import RUN_CONFIG, is_run_dir, run_dirs_inside
from tapa.eval.evaluate import DEFAULT_DEPTHS, DEFAULT_MULTIPLES, EvalOptions, evaluate_run
from tapa.eval.report import check_results_dir, perplexity_table, write_results
from tapa.eval.scaling import ROPE_FAMILY


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from err
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _float_list(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from err
    if not values:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}")
    return values


def _pe_list(text: str) -> tuple[str, ...]:
    values = tuple(v.strip() for v in text.split(",") if v.strip())
    bad = [v for v in values if v not in ROPE_FAMILY]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown RoPE rules {bad}; choose from {ROPE_FAMILY}")
    return values


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR",
                        help="training run directories, or a directory holding runs (e.g. a demo's)")
    parser.add_argument("--checkpoint", default=None,
                        help="a checkpoint directory of RUN_DIR to evaluate instead of its latest "
                             "(one run only)")
    parser.add_argument("--lengths", type=_int_list, default=None,
                        help="evaluation lengths, e.g. 128,256,512 (default: training length x "
                             f"{','.join(f'{m:g}' for m in DEFAULT_MULTIPLES)})")
    parser.add_argument("--multiples", type=_float_list, default=None,
                        help="multiples of the training length to evaluate, instead of --lengths "
                             f"(default {','.join(f'{m:g}' for m in DEFAULT_MULTIPLES)})")
    parser.add_argument("--stride", type=int, default=256, help="sliding-window stride (default 256)")
    parser.add_argument("--max-tokens", type=int, default=16384,
                        help="scored tokens per length, a fixed prefix of the split (0: all; default 16384)")
    parser.add_argument("--split", choices=("val", "test"), default="test")
    parser.add_argument("--eval-pe", type=_pe_list, default=(),
                        help="also evaluate a RoPE model's weights under these rules, "
                             "e.g. rope-pi,rope-yarn,rope-ntk")
    parser.add_argument("--passkey", action="store_true", help="also run the passkey-retrieval grid")
    # the passkey settings (PASSKEY_FLAGS) default to None here, so that one given without
    # --passkey is an error instead of silently doing nothing; EvalOptions holds their defaults
    parser.add_argument("--passkey-lengths", type=_int_list, default=None,
                        help="passkey context lengths (default: training length x 1,2,4,8)")
    parser.add_argument("--passkey-depths", type=_float_list, default=None,
                        help=f"key depths in [0, 1] (default {','.join(f'{d:g}' for d in DEFAULT_DEPTHS)})")
    parser.add_argument("--passkey-trials", type=int, default=None, help="prompts per cell (default 5)")
    parser.add_argument("--passkey-filler", choices=("standard", "corpus"), default=None,
                        help="filler text: standard sentences (default) or held-out corpus tokens")
    parser.add_argument("--seed", type=int, default=None, help="seed of the passkey prompts (default 0)")
    parser.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda, cuda:1, ...")
    parser.add_argument("--out", default=None, help="output directory (default: RUN_DIR/eval)")
    parser.add_argument("--overwrite", action="store_true",
                        help="write into the output directory even if it holds files tapa eval did not write")
    parser.add_argument("--no-progress", action="store_true")


def resolve_device(name: str):
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def expand_runs(paths: list[str]) -> list[Path]:
    """The run directories to evaluate: each path that is a run, or the runs directly inside it.
    ValueError for a path that is neither."""
    runs = []
    for path in map(Path, paths):
        if (path / RUN_CONFIG).is_file():
            try:
                json.loads((path / RUN_CONFIG).read_text())
            except ValueError as err:
                raise ValueError(f"{str(path / RUN_CONFIG)!r} is damaged ({err}); the run cannot be "
                                 "evaluated without it") from err
            runs.append(path)  # a run without checkpoints gets the checkpoint loader's message
            continue
        inside = run_dirs_inside(path)
        if not path.exists():
            raise ValueError(f"RUN_DIR {str(path)!r} does not exist")
        if not inside:
            raise ValueError(f"{str(path)!r} is not a training run directory (no {RUN_CONFIG} and "
                             "checkpoints/) and holds none")
        print(f"tapa eval: {path} holds {len(inside)} runs; evaluating "
              + ", ".join(str(run) for run in inside), file=sys.stderr)
        runs += inside
    return runs


def checkpoint_of(run_dir: Path, checkpoint: str | None) -> Path:
    """The checkpoint to evaluate: RUN's latest, or --checkpoint, which must belong to RUN (else its
    results would be filed under another model's name)."""
    from tapa.model.loading import resolve_checkpoint

    resolved = resolve_checkpoint(checkpoint or run_dir)
    if checkpoint and run_dir.resolve() not in resolved.resolve().parents:
        owner = resolved.parent.parent
        hint = (f"; evaluate it as 'tapa eval {owner} --checkpoint {checkpoint}'" if is_run_dir(owner)
                else "")
        raise ValueError(f"--checkpoint {checkpoint!r} is not a checkpoint of {str(run_dir)!r}{hint}")
    return resolved


def training_tokens(checkpoint: Path) -> int | None:
    """Tokens the checkpoint was trained on in its run (its state.json), for plot titles."""
    from tapa.model.loading import read_state

    return read_state(checkpoint, verify=False).get("tokens")


# options that only the passkey grid reads: flag -> EvalOptions field
PASSKEY_FLAGS = {"--passkey-lengths": "passkey_lengths", "--passkey-depths": "passkey_depths",
                 "--passkey-trials": "passkey_trials", "--passkey-filler": "passkey_filler",
                 "--seed": "seed"}


def options_from_args(args: argparse.Namespace) -> EvalOptions:
    """The EvalOptions of a command line; ValueError for a flag that would be silently ignored
    (--multiples with --lengths, a passkey setting without --passkey)."""
    if args.lengths is not None and args.multiples is not None:
        raise ValueError("--lengths and --multiples both choose the evaluation lengths; pass one of them")
    passkey = {field: getattr(args, flag[2:].replace("-", "_")) for flag, field in PASSKEY_FLAGS.items()}
    given = [flag for flag, field in PASSKEY_FLAGS.items() if passkey[field] is not None]
    if given and not args.passkey:
        raise ValueError(f"the passkey grid reads {', '.join(given)}, but it runs only with --passkey; "
                         "add --passkey or drop them")
    chosen = {field: tuple(value) if field == "passkey_depths" else value
              for field, value in passkey.items() if value is not None}
    if args.multiples is not None:
        chosen["multiples"] = tuple(args.multiples)
    return EvalOptions(lengths=args.lengths, stride=args.stride, max_tokens=args.max_tokens or None,
                       split=args.split, eval_pe=args.eval_pe, passkey=args.passkey,
                       progress=not args.no_progress, **chosen)


def check_eval_pe(eval_pe, checkpoints: list[Path]) -> None:
    """--eval-pe re-evaluates RoPE-family models only; ValueError if no run it names is one (the
    flag would do nothing). Runs of other encodings among RoPE ones (a demo's) are evaluated as
    they are."""
    from tapa.model.loading import checkpoint_model_config

    if not eval_pe:
        return
    encodings = sorted({checkpoint_model_config(checkpoint).pe for checkpoint in checkpoints})
    if not set(encodings) & set(ROPE_FAMILY):
        raise ValueError(f"--eval-pe {','.join(eval_pe)} applies to RoPE-family models "
                         f"({', '.join(ROPE_FAMILY)}); the runs given are {', '.join(encodings)}")


def run(args: argparse.Namespace) -> int:
    options = options_from_args(args)
    runs = expand_runs(args.runs)
    if args.checkpoint and len(runs) > 1:
        raise ValueError("--checkpoint applies to a single RUN_DIR")
    if args.out and len(runs) > 1:
        raise ValueError("--out applies to a single RUN_DIR; use 'tapa report' to merge runs")
    # everything a user can get wrong is checked before the first (possibly long) evaluation
    checkpoints = [checkpoint_of(run_dir, args.checkpoint) for run_dir in runs]
    check_eval_pe(options.eval_pe, checkpoints)
    out_dirs = [Path(args.out) if args.out else run_dir / "eval" for run_dir in runs]
    for out_dir in out_dirs:
        check_results_dir(out_dir, overwrite=args.overwrite, command="tapa eval")
    device = resolve_device(args.device)
    for run_dir, checkpoint, out_dir in zip(runs, checkpoints, out_dirs):
        results = evaluate_run(run_dir, options, device=device, checkpoint=checkpoint)
        tokens = training_tokens(checkpoint)
        for method in results["methods"]:
            method.setdefault("train_tokens", tokens)
        written = write_results(results, out_dir, title=f"{run_dir.name}: perplexity vs length")
        print(perplexity_table(results["methods"]))
        print(f"\nwrote {len(written)} files to {out_dir}: " + ", ".join(p.name for p in written))
    if len(runs) > 1:
        print("\ncompare them in one table and plot with: tapa report " + " ".join(map(str, runs)))
    return 0
