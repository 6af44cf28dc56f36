"""The `tapa` command line. Thin: each command lives in the module named below, which defines
`add_arguments(parser)` and `run(args)`; modules are imported only when their command runs.

A user's mistake (a bad argument, a missing or non-run directory, a missing or corrupt checkpoint,
an unwritable path) ends in one line on stderr, `tapa COMMAND: error: ...`, and exit status 1;
`--debug` anywhere on the command line, or TAPA_DEBUG=1, shows the Python traceback instead.
A usage error (an unknown flag such as --device on a command without one, a bad value) is one line
as well, `tapa COMMAND: error: ...`, with argparse's exit status 2. A Python warning is one line,
`tapa COMMAND: warning: ...`, without the source file and line that --debug shows.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import warnings

import tapa
from tapa._torchrun import error_for_this_process

# command -> (module, one-line help)
COMMANDS = {
    "demo": ("tapa.eval.demo", "train small RoPE, TAPA, TAPA-hybrid and NoPE-hybrid models, compare them past the training length"),
    "theory": ("tapa.theory.command", "Monte Carlo of logit mean/variance vs distance (RoPE vs TAPA)"),
    "data": ("tapa.data.command", "build or inspect the tokenized corpus cache"),
    "train": ("tapa.train.command", "pretrain or continue pretraining a model"),
    "eval": ("tapa.eval.command", "perplexity vs length and passkey retrieval for trained runs"),
    "report": ("tapa.eval.report", "merge several evaluated runs into one table and plot"),
    "bench": ("tapa.bench.command", "GPU benchmarks: attention kernel, varlen, local attention, model throughput, context parallelism, decoding, generation"),
    "export": ("tapa.hf.export", "export a tapa training checkpoint to a transformers model directory"),
    "convert": ("tapa.hf.convert", "convert a Llama, Mistral, Qwen2 or Qwen3 directory, or a tapa RoPE run, to TAPA attention (or a TAPA hybrid)"),
}

# What a user's mistake raises: ValueError (bad arguments and configs; CheckpointError is one) and
# OSError (missing files, permissions, a file where a directory belongs, a full disk).
USER_ERRORS = (ValueError, OSError)
MISSING_EXTRA = "tapa needs the optional package"  # the ImportError of tapa._optional.require
DEBUG_FLAG = "--debug"
DEBUG_HELP = "on an error, show the Python traceback (as TAPA_DEBUG=1 does)"


class _CommandParser(argparse.ArgumentParser):
    """A command's parser (and its subcommands' parsers: add_subparsers makes them of this class):
    a usage error is one line, without argparse's usage synopsis, with its exit status 2."""

    def error(self, message: str):
        line = error_for_this_process(f"{self.prog}: error: {message} ('{self.prog} --help' lists the options)")
        self.exit(2, f"{line}\n" if line else None)


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
    parser.add_argument(DEBUG_FLAG, action="store_true", help=DEBUG_HELP)
    parser.add_argument("command", choices=list(COMMANDS), metavar="COMMAND",
                        help="one of the commands below")
    return parser


def _debugging(argv: list[str]) -> bool:
    return DEBUG_FLAG in argv or os.environ.get("TAPA_DEBUG", "") not in ("", "0")


def _one_line_warning(name: str):
    """warnings.formatwarning for command `name`: the message on one line, no source location."""
    def format_warning(message, category, filename, lineno, line=None) -> str:
        return f"tapa {name}: warning: {' '.join(str(message).split())}\n"
    return format_warning


def main(argv: list[str] | None = None) -> int:
    """Run one command. Returns its exit status; a user error raises SystemExit with one line."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = _debugging(argv)
    argv = [arg for arg in argv if arg != DEBUG_FLAG]
    if not argv:
        _top_parser().print_help()
        return 2
    if argv[0] not in COMMANDS:
        _top_parser().parse_args(argv)  # prints help, version or a usage error and exits
        return 2
    try:
        return _run_command(argv[0], argv[1:], debug)
    except SystemExit as exit_:
        # every command's error line (its own SystemExit("tapa CMD: error: ..."), or a user error
        # caught below) goes one way: under torchrun, once per launch and to torchrun's report
        if not isinstance(exit_.code, str):
            raise
        line = error_for_this_process(exit_.code)
        if line == exit_.code:
            raise
        raise SystemExit(line or 1) from None


def _run_command(name: str, rest: list[str], debug: bool) -> int:
    module_name, help_ = COMMANDS[name]
    format_warning = warnings.formatwarning
    if not debug:
        warnings.formatwarning = _one_line_warning(name)
    try:
        module = importlib.import_module(module_name)
        parser = _CommandParser(prog=f"tapa {name}", description=help_)
        module.add_arguments(parser)
        parser.add_argument(DEBUG_FLAG, action="store_true", help=DEBUG_HELP)
        args = parser.parse_args(rest)
        return int(module.run(args) or 0)
    except KeyboardInterrupt:
        if debug:
            raise
        print(f"tapa {name}: interrupted", file=sys.stderr)
        return 130
    except (*USER_ERRORS, ImportError) as err:
        if debug or (isinstance(err, ImportError) and MISSING_EXTRA not in str(err)):
            raise
        message = " ".join(str(err).split("\n")) or type(err).__name__
        raise SystemExit(f"tapa {name}: error: {message} (--debug shows the traceback)") from None
    finally:
        warnings.formatwarning = format_warning


if __name__ == "__main__":
    sys.exit(main())
