"""`tapa eval RUN_DIR [RUN_DIR...]`: perplexity vs length (and passkey retrieval, and the retrieval
tasks of `tapa.eval.tasks`) for trained runs, and for TAPA transformers model directories (what
tapa convert and tapa export write: with --data, tokenized by the directory's tokenizer.json).
Writes RUN_DIR/eval/{results.json, results.md, perplexity.png, position_loss.png, passkey_*.png,
retrieval_*.png}; with --data SOURCE, RUN_DIR/eval-<name of SOURCE>/ instead, so the default
evaluation's files are never replaced by another text's.
A directory that holds run directories (what `tapa demo` writes) stands for the runs inside it.
docs/evaluation.md describes every measurement and file."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Iterator

from tapa._paths import RUN_CONFIG, check_output_dir, is_run_dir, run_dirs_inside
from tapa.eval.evaluate import (DEFAULT_DEPTHS, DEFAULT_MULTIPLES, EvalOptions, check_data_source, data_name,
                                 evaluate_run)
from tapa.eval.passkey_eval import RETRIEVAL_BATCH_TOKENS
from tapa.eval.report import (RESULT_FILES, RESULTS_JSON, local_window, passkey_table, perplexity_table,
                              task_tables, write_results)
from tapa.eval.scaling import ROPE_FAMILY
from tapa.eval.tasks import TASKS, TaskSettings, default_trials, parse_tasks, trials_for_half_width


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


def _task_list(text: str) -> tuple[str, ...]:
    try:
        return parse_tasks(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from err


def _pe_list(text: str) -> tuple[str, ...]:
    values = tuple(v.strip() for v in text.split(",") if v.strip())
    bad = [v for v in values if v not in ROPE_FAMILY]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown RoPE rules {bad}; choose from {ROPE_FAMILY}")
    return values


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR",
                        help="training run directories, or a directory holding runs (e.g. a demo's), or "
                             "TAPA model directories (tapa convert / tapa export; they need --data, and "
                             "their tokenizer.json tokenizes it)")
    parser.add_argument("--train-len", type=int, default=None,
                        help="model directories: the length the model was trained at (default: the "
                             "exported run's seq_len, else the model's original_seq_len)")
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
    parser.add_argument("--data", default=None, metavar="SOURCE",
                        help="evaluate on this text instead of the run's corpus: any source 'tapa train "
                             "--data' takes (a text file, a directory of files, a .jsonl, hf:NAME or "
                             "hf:DIR), tokenized with the run's own tokenizer; it also gives the passkey "
                             "and task filler. Results go to RUN_DIR/eval-<name of SOURCE>/ (or --out)")
    parser.add_argument("--text-field", default=None,
                        help="the text field of a .jsonl or hf --data source (default: the run's, 'text')")
    parser.add_argument("--split", choices=("val", "test", "all"), default=None,
                        help="which text: the run corpus' held-out val or test split (default test); with "
                             "--data, 'all' of it (the default) or its val/test part split as the run's")
    parser.add_argument("--eval-pe", type=_pe_list, default=(),
                        help="also evaluate a RoPE model's weights under these rules, "
                             "e.g. rope-pi,rope-yarn,rope-ntk")
    parser.add_argument("--eval-query-temperature", type=int, default=None, metavar="BASE",
                        help="also evaluate the model with its global layers' queries scaled by "
                             "1 + S * log(1 + floor((p + 1) / BASE)) at position p (Llama 4's log-length "
                             "temperature; BASE is usually the training length; a run trained with "
                             "this very temperature is evaluated once)")
    parser.add_argument("--eval-query-temperature-scale", type=float, default=None, metavar="S",
                        help="the slope S of --eval-query-temperature (default 0.1)")
    parser.add_argument("--passkey", action="store_true", help="also run the passkey-retrieval grid")
    # the passkey settings (PASSKEY_FLAGS) default to None here, so that one given without
    # --passkey is an error instead of silently doing nothing; EvalOptions holds their defaults
    parser.add_argument("--passkey-lengths", type=_int_list, default=None,
                        help="passkey context lengths (default: training length x 1,2,4,8)")
    parser.add_argument("--passkey-depths", type=_float_list, default=None,
                        help=f"key depths in [0, 1] (default {','.join(f'{d:g}' for d in DEFAULT_DEPTHS)})")
    parser.add_argument("--passkey-trials", type=int, default=None, help="prompts per cell (default 5)")
    parser.add_argument("--passkey-filler", choices=("standard", "corpus"), default=None,
                        help="filler text: standard sentences (default) or the evaluated text's tokens "
                             "(the default with --data)")
    parser.add_argument("--tasks", type=_task_list, default=None, metavar="TASKS",
                        help="also run these retrieval tasks, comma-separated, or 'all': "
                             f"{', '.join(TASKS)}")
    parser.add_argument("--task-lengths", type=_int_list, default=None,
                        help="task context lengths (default: training length x 1,2,4,8)")
    parser.add_argument("--task-depths", type=_float_list, default=None,
                        help="depths of the asked needle in [0, 1] (default "
                             f"{','.join(f'{d:g}' for d in DEFAULT_DEPTHS)})")
    parser.add_argument("--task-trials", type=int, default=None,
                        help="prompts per cell (default ceil({} / depths): {} with 5 depths, +-5 points "
                             "on each length's accuracy over all depths)".format(trials_for_half_width(),
                                                                                  default_trials(5)))
    parser.add_argument("--task-filler", choices=("corpus", "standard"), default=None,
                        help="task filler text: the evaluated text's tokens (default) or standard sentences")
    parser.add_argument("--retrieval-batch-tokens", type=int, default=None, metavar="N",
                        help="passkey and task prompts are decoded together, every depth of a length, "
                             f"up to N tokens a batch (default {RETRIEVAL_BATCH_TOKENS}; lower it if memory "
                             "runs out)")
    defaults = TaskSettings()
    parser.add_argument("--distractors", type=int, default=None,
                        help=f"multi-key: needles of other keys (default {defaults.distractors})")
    parser.add_argument("--values", type=int, default=None,
                        help=f"multi-value: values of the key (default {defaults.values})")
    parser.add_argument("--hops", type=int, default=None,
                        help=f"variable-tracking: assignments per chain (default {defaults.hops})")
    parser.add_argument("--chains", type=int, default=None,
                        help=f"variable-tracking: chains, the asked one included (default {defaults.chains})")
    parser.add_argument("--seed", type=int, default=None,
                        help="seed of the passkey and task prompts (default 0)")
    parser.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda, cuda:1, ...")
    parser.add_argument("--out", default=None,
                        help="output directory (default: RUN_DIR/eval, with --data RUN_DIR/eval-<name>)")
    parser.add_argument("--overwrite", action="store_true",
                        help="write into the output directory even if it holds files tapa eval did not write")
    parser.add_argument("--no-progress", action="store_true")


def resolve_device(name: str):
    """--device as a torch.device; ValueError (one line) for a name torch does not know, or a
    device this machine does not have (cuda without CUDA, cuda:3 on two GPUs)."""
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError) as err:
        raise ValueError(f"--device {name!r} is not a device name (auto, cpu, cuda, cuda:1, ...)") from err
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"--device {name!r}: CUDA is not available on this machine; "
                             "pass --device cpu (or auto)")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(f"--device {name!r}: this machine has {torch.cuda.device_count()} CUDA "
                             f"device(s), cuda:0 to cuda:{torch.cuda.device_count() - 1}")
    elif device.type != "cpu":
        backend = getattr(torch, device.type, None)
        if not (hasattr(backend, "is_available") and backend.is_available()):
            raise ValueError(f"--device {name!r}: no {device.type} device on this machine; "
                             "pass --device cpu (or auto)")
    return device


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


PIN_PREFIX = ".pin-"  # RUN/checkpoints/.pin-<host>-<pid>-<random>: a checkpoint eval is reading


def _remove_stale_pins(root: Path) -> None:
    """The snapshots of evaluations on this host whose process is gone (a kill leaves them)."""
    import socket

    from tapa.data.cache import _process_alive

    host = socket.gethostname()
    for path in root.glob(f"{PIN_PREFIX}*"):
        parts = path.name[len(PIN_PREFIX):].rsplit("-", 2)
        if len(parts) == 3 and parts[0] == host and parts[1].isdigit() and not _process_alive(int(parts[1])):
            shutil.rmtree(path, ignore_errors=True)


def _link_snapshot(checkpoint: Path) -> Path | None:
    """Hard links to the files of `checkpoint` in a sibling folder, so that a trainer pruning it
    (shutil.rmtree) cannot take them away mid-read. None where links cannot be made (a read-only
    run, a filesystem without them): then the checkpoint is read in place. FileNotFoundError if
    the checkpoint, or one of its files, is already gone."""
    import errno
    import os
    import socket
    import uuid

    from tapa.model.loading import STATE, read_json

    _remove_stale_pins(checkpoint.parent)
    snapshot = checkpoint.parent / f"{PIN_PREFIX}{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        snapshot.mkdir()
    except OSError:
        return None
    try:
        os.link(checkpoint / STATE, snapshot / STATE)  # first: it lists the files it vouches for
        for name in read_json(snapshot / STATE, "checkpoint state").get("sha256", {}):
            os.link(checkpoint / name, snapshot / name)
    except FileNotFoundError:
        shutil.rmtree(snapshot, ignore_errors=True)
        raise
    except OSError as err:
        shutil.rmtree(snapshot, ignore_errors=True)
        if err.errno in (errno.EXDEV, errno.EPERM, errno.EACCES, errno.EROFS, errno.EMLINK,
                         errno.ENOTSUP, errno.ENOSPC):
            return None
        raise
    return snapshot


_PIN_ATTEMPTS = 8


def _latest_text(run_dir: Path) -> str | None:
    try:
        return (Path(run_dir) / "checkpoints" / "latest").read_text()
    except OSError:
        return None


def choose_checkpoint(run_dir: Path, checkpoint: str | None) -> Path:
    """checkpoint_of, again while a running trainer moves checkpoints/latest on (it can name a step
    that is pruned before it is opened); any other error at once."""
    from tapa.model.loading import CheckpointError

    for attempt in range(_PIN_ATTEMPTS):
        before = _latest_text(run_dir)
        try:
            return checkpoint_of(run_dir, checkpoint)
        except CheckpointError:
            if checkpoint or attempt == _PIN_ATTEMPTS - 1 or _latest_text(run_dir) == before:
                raise
        time.sleep(0.02 * (attempt + 1))
    raise AssertionError("unreachable")


@contextmanager
def pinned_checkpoint(run_dir: Path, checkpoint: Path, *, explicit: bool) -> Iterator[Path]:
    """`checkpoint` as a path a running trainer cannot prune while it is read (a hard-link snapshot,
    removed afterwards). A checkpoint pruned before it could be pinned is replaced by the run's
    newest, with a note; with --checkpoint (explicit) that is an error instead."""
    first = checkpoint
    for _ in range(_PIN_ATTEMPTS):
        try:
            snapshot = _link_snapshot(checkpoint)
            break
        except FileNotFoundError:
            if explicit:
                raise ValueError(f"--checkpoint {str(checkpoint)!r} was removed before it could be read "
                                 "(pruned by a running trainer?); choose a newer checkpoint") from None
            checkpoint = choose_checkpoint(run_dir, None)
    else:
        raise ValueError(f"the checkpoints of {str(run_dir)!r} were pruned faster than they could be read; "
                         "evaluate after training, or train with a larger --keep-checkpoints")
    if checkpoint != first:
        print(f"tapa eval: note: {first.name} of {run_dir} was removed before it could be read (pruned by "
              f"a running trainer); evaluating {checkpoint.name} instead", file=sys.stderr)
    try:
        yield snapshot or checkpoint
    finally:
        if snapshot is not None:
            shutil.rmtree(snapshot, ignore_errors=True)


def training_tokens(checkpoint: Path) -> int | None:
    """Tokens the checkpoint was trained on in its run (its state.json), for plot titles."""
    from tapa.model.loading import read_state

    return read_state(checkpoint, verify=False).get("tokens")


# options that only the passkey grid reads: flag -> EvalOptions field
PASSKEY_FLAGS = {"--passkey-lengths": "passkey_lengths", "--passkey-depths": "passkey_depths",
                 "--passkey-trials": "passkey_trials", "--passkey-filler": "passkey_filler"}
# options that only the retrieval tasks read: flag -> EvalOptions field (or TaskSettings field)
TASK_FLAGS = {"--task-lengths": "task_lengths", "--task-depths": "task_depths",
              "--task-trials": "task_trials", "--task-filler": "task_filler"}
TASK_SETTING_FLAGS = {"--distractors": "distractors", "--values": "values", "--hops": "hops",
                      "--chains": "chains"}


def _given(args: argparse.Namespace, flags: dict) -> dict:
    """{flag: value} of the flags of `flags` given on the command line (not None)."""
    values = {flag: getattr(args, flag[2:].replace("-", "_")) for flag in flags}
    return {flag: value for flag, value in values.items() if value is not None}


def options_from_args(args: argparse.Namespace) -> EvalOptions:
    """The EvalOptions of a command line; ValueError for a flag that would be silently ignored
    (--multiples with --lengths, a passkey setting without --passkey, a task setting without --tasks,
    --text-field without --data)."""
    if args.lengths is not None and args.multiples is not None:
        raise ValueError("--lengths and --multiples both choose the evaluation lengths; pass one of them")
    passkey = _given(args, PASSKEY_FLAGS)
    seed_flag = ["--seed"] if args.seed is not None and not args.tasks else []
    if passkey and not args.passkey:
        raise ValueError(f"the passkey grid reads {', '.join([*passkey, *seed_flag])}, but it runs only with "
                         "--passkey; add --passkey or drop them")
    tasks = _given(args, TASK_FLAGS)
    settings = _given(args, TASK_SETTING_FLAGS)
    if (tasks or settings) and not args.tasks:
        raise ValueError(f"the retrieval tasks read {', '.join([*tasks, *settings])}, but they run only with "
                         f"--tasks; add --tasks (e.g. --tasks all) or drop them")
    if args.seed is not None and not (args.passkey or args.tasks):
        raise ValueError("--seed sets the passkey and task prompts; add --passkey or --tasks, or drop it")
    if args.text_field is not None and not args.data:
        raise ValueError("--text-field names the text field of a --data source; add --data or drop it")
    if args.split == "all" and not args.data:
        raise ValueError("--split all reads the whole of a --data source; the run's own corpus holds only "
                         "its val and test splits out of training (choose one of them)")
    if args.retrieval_batch_tokens is not None and not (args.passkey or args.tasks):
        raise ValueError("--retrieval-batch-tokens sizes the passkey and task batches; add --passkey or "
                         "--tasks, or drop it")
    if args.retrieval_batch_tokens is not None and args.retrieval_batch_tokens < 1:
        raise ValueError(f"--retrieval-batch-tokens must be at least 1, got {args.retrieval_batch_tokens}")
    if args.task_trials is not None and args.task_trials < 1:
        raise ValueError(f"--task-trials must be at least 1, got {args.task_trials}")
    for flag, field_name in TASK_SETTING_FLAGS.items():
        if flag in settings:
            try:
                TaskSettings(**{field_name: settings[flag]})
            except ValueError as err:
                raise ValueError(f"{flag}: {err}") from err
    chosen = {field_name: tuple(value) if field_name.endswith("_depths") else value
              for flag, value in {**passkey, **tasks}.items()
              for field_name in [{**PASSKEY_FLAGS, **TASK_FLAGS}[flag]]}
    if args.data and "passkey_filler" not in chosen:
        chosen["passkey_filler"] = "corpus"  # with --data, the passkey filler comes from that text too
    if args.multiples is not None:
        chosen["multiples"] = tuple(args.multiples)
    if args.seed is not None:
        chosen["seed"] = args.seed
    if args.eval_query_temperature_scale is not None and args.eval_query_temperature is None:
        raise ValueError("--eval-query-temperature-scale is the slope of --eval-query-temperature BASE; "
                         "add it, or drop the scale")
    if args.eval_query_temperature is not None:
        chosen["query_temperature"] = args.eval_query_temperature
    if args.eval_query_temperature_scale is not None:
        chosen["query_temperature_scale"] = args.eval_query_temperature_scale
    if args.retrieval_batch_tokens is not None:
        chosen["retrieval_batch_tokens"] = args.retrieval_batch_tokens
    return EvalOptions(lengths=args.lengths, stride=args.stride, max_tokens=args.max_tokens or None,
                       split=args.split, data=args.data, text_field=args.text_field, eval_pe=args.eval_pe,
                       passkey=args.passkey, tasks=args.tasks or (),
                       task_settings=TaskSettings(**{TASK_SETTING_FLAGS[f]: v for f, v in settings.items()}),
                       progress=not args.no_progress, **chosen)


def check_eval_pe(eval_pe, checkpoints: list[Path]) -> None:
    """--eval-pe re-evaluates RoPE-family models only; ValueError if no run it names is one (the
    flag would do nothing). Runs of other encodings among RoPE ones (a demo's) are evaluated as
    they are."""
    from tapa.model.loading import checkpoint_model_config, is_model_dir, model_dir_config

    if not eval_pe:
        return
    encodings = sorted({(model_dir_config(checkpoint) if is_model_dir(checkpoint)
                         else checkpoint_model_config(checkpoint)).pe for checkpoint in checkpoints})
    if not set(encodings) & set(ROPE_FAMILY):
        raise ValueError(f"--eval-pe {','.join(eval_pe)} applies to RoPE-family models "
                         f"({', '.join(ROPE_FAMILY)}); the runs given are {', '.join(encodings)}")


# the folders of a run that hold its evaluations (RUN/eval, RUN/eval-<name of --data>)
EVAL_SUBDIRS = ("eval", "eval-*")


def check_eval_dir(out_dir: Path, run_dir: Path, *, overwrite: bool) -> Path:
    """The output rule of tapa._paths for results: inside a run directory, only the evaluated run's
    own RUN/eval* folders."""
    own = Path(out_dir).expanduser().resolve().parent == Path(run_dir).resolve()
    return check_output_dir(out_dir, outputs=RESULT_FILES, marker=RESULTS_JSON, overwrite=overwrite,
                            command="tapa eval", run_subdirs=EVAL_SUBDIRS if own else ())


def passkey_note(grid: dict, run_dir: Path, model_dir: bool) -> str | None:
    """A note under a passkey grid that is all zeros from a model never trained on passkey prompts
    (--passkey-fraction 0): the zeros say that it never learned the prompt's answer format, not
    how far it retrieves. None otherwise."""
    correct = grid.get("correct") or grid.get("accuracy") or []
    if any(value for row in correct for value in row):
        return None
    if model_dir:
        trained = None
    else:
        try:
            trained = (json.loads((run_dir / RUN_CONFIG).read_text()).get("train") or {}).get("passkey_fraction")
        except (OSError, ValueError):
            trained = None
    if trained:
        return None
    how = "was never trained" if trained is not None else "may never have been trained"
    return (f"note: every passkey cell is 0: {run_dir.name} {how} on passkey prompts (tapa train "
            "--passkey-fraction, 0 by default), so a small model need not answer in the prompt's format at "
            "all; continue it with --passkey-fraction 0.1 before reading this grid as a retrieval range")


def run(args: argparse.Namespace) -> int:
    with ExitStack() as pins:
        return _run(args, pins)


def _run(args: argparse.Namespace, pins: ExitStack) -> int:
    options = options_from_args(args)
    device = resolve_device(args.device)
    runs = expand_runs(args.runs)
    if args.checkpoint and len(runs) > 1:
        raise ValueError("--checkpoint applies to a single RUN_DIR")
    if args.out and len(runs) > 1:
        raise ValueError("--out applies to a single RUN_DIR; use 'tapa report' to merge runs")
    # everything a user can get wrong is checked before the first (possibly long) evaluation;
    # every checkpoint is pinned first, so that a trainer still writing the run cannot prune it
    from tapa.model.loading import is_model_dir, model_dir_config

    model_dirs = {run_dir for run_dir in runs if is_model_dir(run_dir)}
    for model_dir in model_dirs:  # a transformers directory: checked now, read as it is (no pin)
        model_dir_config(model_dir)  # another model_type (a Llama): one line that says to convert it
        if not options.data:
            raise ValueError(f"{str(model_dir)!r} is a model directory, which carries no evaluation text; "
                             "pass --data SOURCE (a text file, a directory of files, a .jsonl, hf:NAME)")
        if args.checkpoint:
            raise ValueError("--checkpoint picks a checkpoint of a run; a model directory is one model")
    if args.train_len is not None and len(model_dirs) != len(runs):
        raise ValueError("--train-len applies to model directories only (a run records its own)")
    checkpoints = [run_dir if run_dir in model_dirs else
                   pins.enter_context(pinned_checkpoint(run_dir, choose_checkpoint(run_dir, args.checkpoint),
                                                        explicit=bool(args.checkpoint)))
                   for run_dir in runs]
    check_eval_pe(options.eval_pe, checkpoints)
    if options.data:  # before the model loads: a missing or empty source is a one-line error now
        check_data_source(options.data, options.text_field or "text")
    default_dir = "eval" if not options.data else f"eval-{data_name(options.data)}"
    out_dirs = [Path(args.out) if args.out else run_dir / default_dir for run_dir in runs]
    for run_dir, out_dir in zip(runs, out_dirs):
        check_eval_dir(out_dir, run_dir, overwrite=args.overwrite)
    for run_dir, checkpoint, out_dir in zip(runs, checkpoints, out_dirs):
        if run_dir in model_dirs:
            results = evaluate_run(run_dir, options, device=device, train_len=args.train_len)
            tokens = None
        else:
            results = evaluate_run(run_dir, options, device=device, checkpoint=checkpoint)
            tokens = training_tokens(checkpoint)
        for method in results["methods"]:
            method.setdefault("train_tokens", tokens)
        on = "" if not options.data else f" on {data_name(options.data)}"
        written = write_results(results, out_dir, title=f"{run_dir.name}: perplexity vs length{on}")
        data = results["data"]
        print(f"data: {data['source']} ({data['split']}, {data['tokens']:,} tokens)")
        print(perplexity_table(results["methods"]))
        for method in results["methods"]:
            if method.get("passkey"):
                print("\npasskey retrieval:\n" + passkey_table(method["label"], method["passkey"],
                                                                 local_window(method)))
                note = passkey_note(method["passkey"], run_dir, run_dir in model_dirs)
                if note:
                    print(note)
        tables = task_tables(results["methods"])
        if tables:
            print("\n" + tables)
        print(f"\nwrote {len(written)} files to {out_dir}: " + ", ".join(p.name for p in written))
    if len(runs) > 1:
        print("\ncompare them in one table and plot with: tapa report " + " ".join(map(str, runs)))
    return 0
