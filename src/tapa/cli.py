"""The `tapa` command line. Thin: each command lives in the module named below, which defines
`add_arguments(parser)` and `run(args)`; modules are imported only when their command runs."""

from __future__ import annotations

import argparse
import importlib
import sys

import tapa

# command -> (module, one-line help)
COMMANDS = {
    "demo": ("tapa.eval.demo", "train small RoPE, TAPA and TAPA-hybrid models, compare them past the training length"),
    "theory": ("tapa.theory.command", "Monte Carlo of logit mean/variance vs distance (RoPE vs TAPA)"),
    "data": ("tapa.data.command", "build or inspect the tokenized corpus cache"),
    "train": ("tapa.train.command", "pretrain or continue pretraining a model"),
    "eval": ("tapa.eval.command", "perplexity vs length and passkey retrieval for trained runs"),
    "report": ("tapa.eval.report", "merge several evaluated runs into one table and plot"),
    "bench": ("tapa.bench.command", "GPU benchmarks: attention kernel, model throughput, decoding"),
    "export": ("tapa.hf.export", "export a tapa training checkpoint to a transformers model directory"),
    "convert": ("tapa.hf.convert", "convert a LlamaForCausalLM directory to TAPA attention"),
}


def _top_parser() -> argparse.ArgumentParser:
    width = max(map(len, COMMANDS))
    listing = "\n".join(f"  {name:<{width}}  {help_}" for name, (_, help_) in COMMANDS.items())
    parser = argparse.ArgumentParser(
        prog="tapa",
        description="Token-Aware Phase Attention: kernels, models, training and evaluation.",
        epilog=f"commands:\n{listing}\n\nRun 'tapa COMMAND --help' for a command's options.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"tapa {tapa.__version__}")
    parser.add_argument("command", choices=list(COMMANDS), metavar="COMMAND")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        _top_parser().parse_args(argv)  # prints help, version or a usage error and exits
        return 2
    name, rest = argv[0], argv[1:]
    module_name, help_ = COMMANDS[name]
    module = importlib.import_module(module_name)
    parser = argparse.ArgumentParser(prog=f"tapa {name}", description=help_)
    module.add_arguments(parser)
    args = parser.parse_args(rest)
    result = module.run(args)
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
