"""The device-call scripts (scripts/*.sh, scripts/study/*.sh) name only flags the CLIs have.

Device time is the scarce resource: a misspelt flag in a script costs a step of a GPU call. Each
`tapa ...`, `python3 -m tapa.cli ...` or `python3 -m tapa.bench.<module> ...` command in a script is matched
against the argparse parser it reaches (subcommands followed), and every `--flag` it passes must be
one of that parser's options.
"""

from __future__ import annotations

import argparse
import importlib
import re
import shlex
import pytest
from helpers import ROOT

SCRIPTS = sorted([*ROOT.glob("scripts/*.sh"), *ROOT.glob("scripts/study/*.sh")])
COMMAND = re.compile(r"(?:python3? -m (tapa\.cli|tapa\.bench\.\w+)\b|(?<![\w/.$-])tapa(?= [a-z]))(.*)")
SHELL_END = re.compile(r"\s(?:\d?>|\||&&|;|\))")


def commands(text: str) -> list[tuple[str, list[str]]]:
    """(module, argv) of each tapa command in a script; shell expansions become 'X'."""
    text = text.replace("\\\n", " ")
    found = []
    for line in text.splitlines():
        if line.lstrip().startswith("#"):
            continue
        for match in COMMAND.finditer(line):
            rest = match.group(2)
            end = SHELL_END.search(rest)
            rest = rest[:end.start()] if end else rest
            rest = re.sub(r"\$\{[^}]*\}|\$\([^)]*\)|\$\w+", "X", rest)
            found.append((match.group(1) or "tapa.cli", shlex.split(rest)))
    return found


def _subparsers(parser: argparse.ArgumentParser):
    return next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)


def options_of(module: str, argv: list[str]) -> tuple[set[str], list[str]]:
    """(every option string along the parser path argv selects, the subcommands taken)."""
    if module == "tapa.cli":
        from tapa.cli import COMMANDS

        name, argv = argv[0], argv[1:]
        assert name in COMMANDS, f"tapa has no command {name!r}"
        module, path = COMMANDS[name][0], [name]
    else:
        path = []
    parser = argparse.ArgumentParser()
    importlib.import_module(module).add_arguments(parser)
    options = set(parser._option_string_actions)
    while (sub := _subparsers(parser)) is not None and argv and argv[0] in sub.choices:
        parser, argv = sub.choices[argv[0]], argv[1:]
        path.append(parser.prog.split()[-1])
        options |= set(parser._option_string_actions)
    return options, path


def test_the_scripts_are_found():
    names = {p.name for p in SCRIPTS}
    assert {"gpu_h200_kernel_run6.sh", "gpu_repeat_probe.sh", "gpu_batch.sh"} <= names
    run6 = commands((ROOT / "scripts" / "gpu_h200_kernel_run6.sh").read_text())
    assert ("tapa.cli", ["bench", "generate", "--out", "X/generate"]) in run6


def test_a_misspelt_flag_is_caught():
    (module, argv), = commands('python3 -m tapa.cli bench decode --batch 8 --graph --out "$WORK/x" > log\n')
    options, path = options_of(module, argv)
    assert path == ["bench", "decode"] and "--graphs" in options and "--graph" not in options


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_flag_of_a_script_exists(script):
    for module, argv in commands(script.read_text()):
        options, _ = options_of(module, argv)
        flags = [arg.split("=")[0] for arg in argv if arg.startswith("--")]
        unknown = [flag for flag in flags if flag not in options]
        assert not unknown, f"{script.name}: {module} {' '.join(argv[:3])} ...: unknown {unknown}"
