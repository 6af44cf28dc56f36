"""`tapa eval RUN_DIR [RUN_DIR...]`: perplexity vs length (and passkey retrieval) for trained runs.
Writes RUN_DIR/eval/{results.json, results.md, perplexity.png, position_loss.png, passkey_*.png}."""

from __future__ import annotations

import argparse
from pathlib import Path

from tapa.eval.evaluate import DEFAULT_DEPTHS, DEFAULT_MULTIPLES, EvalOptions, evaluate_run
from tapa.eval.report import perplexity_table, write_results
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
        return [float(v) for v in text.split(",") if v.strip()]
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from err


def _pe_list(text: str) -> tuple[str, ...]:
    values = tuple(v.strip() for v in text.split(",") if v.strip())
    bad = [v for v in values if v not in ROPE_FAMILY]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown RoPE rules {bad}; choose from {ROPE_FAMILY}")
    return values


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR", help="training run directories")
    parser.add_argument("--checkpoint", default=None,
                        help="a checkpoint directory to evaluate instead of the run's latest (one run only)")
    parser.add_argument("--lengths", type=_int_list, default=None,
                        help="evaluation lengths, e.g. 128,256,512 (default: training length x "
                             f"{','.join(f'{m:g}' for m in DEFAULT_MULTIPLES)})")
    parser.add_argument("--multiples", type=_float_list, default=list(DEFAULT_MULTIPLES),
                        help="multiples of the training length to evaluate when --lengths is not given")
    parser.add_argument("--stride", type=int, default=256, help="sliding-window stride (default 256)")
    parser.add_argument("--max-tokens", type=int, default=16384,
                        help="scored tokens per length, a fixed prefix of the split (0: all; default 16384)")
    parser.add_argument("--split", choices=("val", "test"), default="test")
    parser.add_argument("--eval-pe", type=_pe_list, default=(),
                        help="also evaluate a RoPE model's weights under these rules, "
                             "e.g. rope-pi,rope-yarn,rope-ntk")
    parser.add_argument("--passkey", action="store_true", help="also run the passkey-retrieval grid")
    parser.add_argument("--passkey-lengths", type=_int_list, default=None,
                        help="passkey context lengths (default: training length x 1,2,4,8)")
    parser.add_argument("--passkey-depths", type=_float_list, default=list(DEFAULT_DEPTHS))
    parser.add_argument("--passkey-trials", type=int, default=5)
    parser.add_argument("--passkey-filler", choices=("standard", "corpus"), default="standard")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda, cuda:1, ...")
    parser.add_argument("--out", default=None, help="output directory (default: RUN_DIR/eval)")
    parser.add_argument("--no-progress", action="store_true")


def resolve_device(name: str):
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def run(args: argparse.Namespace) -> int:
    if args.checkpoint and len(args.runs) > 1:
        raise ValueError("--checkpoint applies to a single RUN_DIR")
    if args.out and len(args.runs) > 1:
        raise ValueError("--out applies to a single RUN_DIR; use 'tapa report' to merge runs")
    options = EvalOptions(lengths=args.lengths, multiples=tuple(args.multiples), stride=args.stride,
                          max_tokens=args.max_tokens or None, split=args.split, eval_pe=args.eval_pe,
                          passkey=args.passkey, passkey_lengths=args.passkey_lengths,
                          passkey_depths=tuple(args.passkey_depths), passkey_trials=args.passkey_trials,
                          passkey_filler=args.passkey_filler, seed=args.seed, progress=not args.no_progress)
    device = resolve_device(args.device)
    for run_dir in args.runs:
        results = evaluate_run(run_dir, options, device=device, checkpoint=args.checkpoint)
        out_dir = Path(args.out) if args.out else Path(run_dir) / "eval"
        written = write_results(results, out_dir, title=f"{Path(run_dir).name}: perplexity vs length")
        print(perplexity_table(results["methods"]))
        print(f"\nwrote {len(written)} files to {out_dir}: " + ", ".join(p.name for p in written))
    return 0
