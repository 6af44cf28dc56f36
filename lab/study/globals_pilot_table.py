"""The globals CPU pilot's summary (lab/study/globals_cpu_pilot.sh; a pilot of issue 37's screen,
not the screen): from one `tapa report` results.json per seed,

1. the mean perplexity of each arm at each length, each seed's value beside it, and 32x over 1x;
2. each lever over its own global kind's base arm (LLLG, window 64, continued at 512), at 1x and
   8x-32x: the mean of the seeds' ratios, each seed's ratio beside it (below 1: the lever helps);
3. TAPA over NoPE globals for each lever, at the same lengths (below 1: TAPA is lower), and the
   seeds on which TAPA is lower at 32x; TAPA's own levers (theta, alpha) against the NoPE base;
4. each hybrid arm over RoPE + YaRN (continued alike) at the same lengths: the issue's "within 1% of
   RoPE + YaRN in length".

Every row uses the seeds that have its runs and names them (a seed may have run only some levers);
a seed is named by its folder (seed1/results.json: 1) or else by the file's name.

    python3 -m lab.study.globals_pilot_table seed0/results.json seed1/results.json > summary.md
"""

from __future__ import annotations

import sys
from pathlib import Path

from lab.study.retrofit_pilot_table import fmt, load

KINDS = {"tapa": "TAPA", "nope": "NoPE"}
# lever tag -> its name; the arm's run is hybrid-KIND-TAG-c (continued at 512), except c1024
LEVERS = {
    "c1024": "continual stage at 1024 (8x)",
    "w32": "window 32",
    "w16": "window 16",
    "temp": "query temperature, base 128",
    "llg": "LLG (6 layers: LLGLLG)",
    "l5g": "LLLLLG (6 layers)",
    "theta25": "theta 0.25",
    "theta375": "theta 0.375",
    "theta625": "theta 0.625",
    "theta75": "theta 0.75",
    "alpha05": "alpha 0.05",
    "alpha2": "alpha 0.2",
}
# TAPA's own settings in its globals: no NoPE arm
TAPA_ONLY = tuple(lever for lever in LEVERS if lever.startswith(("theta", "alpha")))
ANCHOR = "rope-yarn"
# the lengths of the ratio tables, as multiples of the 128-token pretraining length
RATIO_LENGTHS = (128, 1024, 2048, 4096)


def run_name(kind: str, lever: str | None) -> str:
    """The continued run of a kind's base arm (lever None) or of one of its levers."""
    if lever is None:
        return f"hybrid-{kind}-c"
    if lever == "c1024":
        return f"hybrid-{kind}-c1024"
    return f"hybrid-{kind}-{lever}-c"


def arms() -> dict[str, str]:
    """run -> the arm's name, in the order of the perplexity table."""
    table = {ANCHOR: "RoPE + YaRN, continued (anchor)"}
    for kind, label in KINDS.items():
        table[run_name(kind, None)] = f"{label} hybrid, base (LLLG, w64)"
    for lever, what in LEVERS.items():
        for kind, label in KINDS.items():
            if kind == "tapa" or lever not in TAPA_ONLY:
                table[run_name(kind, lever)] = f"{label} hybrid, {what}"
    return table


def seed_name(path: str) -> str:
    """seed1/results.json -> '1'; seed2.json -> '2'."""
    name = Path(path).parent.name if Path(path).name == "results.json" else Path(path).stem
    return name.removeprefix("seed")


def _with(seeds: dict[str, dict], *runs: str) -> dict[str, dict]:
    """The seeds that have every one of the runs."""
    return {name: seed for name, seed in seeds.items() if all(run in seed for run in runs)}


def perplexity_table(seeds: dict[str, dict]) -> list[str]:
    """One row per arm: the seeds that have it, the mean perplexity at each length with each seed's
    value, and the mean over those seeds of the longest length over the shortest."""
    lengths = sorted(next(iter(next(iter(seeds.values())).values())))
    lines = ["| arm | seeds | " + " | ".join(str(n) for n in lengths) + " | longest / shortest |",
             "|---|---|" + "---|" * (len(lengths) + 1)]
    for run, name in arms().items():
        have = _with(seeds, run)
        if not have:
            continue
        cells = [fmt([seed[run][n] for seed in have.values()]) for n in lengths]
        ratios = [seed[run][lengths[-1]] / seed[run][lengths[0]] for seed in have.values()]
        lines.append(f"| {name} | {', '.join(have)} | " + " | ".join(cells)
                     + f" | {sum(ratios) / len(ratios):.2f} |")
    return lines


def _ratio_header(first: str) -> list[str]:
    return [f"| {first} | seeds | " + " | ".join(f"{n // 128}x ({n})" for n in RATIO_LENGTHS) + " |",
            "|---|---|" + "---|" * len(RATIO_LENGTHS)]


def _ratio_row(name: str, seeds: dict[str, dict], top: str, bottom: str) -> str:
    have = _with(seeds, top, bottom)
    return (f"| {name} | {', '.join(have)} | "
            + " | ".join(fmt([seed[top][n] / seed[bottom][n] for seed in have.values()], 3)
                         for n in RATIO_LENGTHS) + " |")


def lever_table(seeds: dict[str, dict]) -> list[str]:
    """Each lever's perplexity over its own kind's base arm."""
    lines = _ratio_header("lever / its kind's base")
    for lever, what in LEVERS.items():
        for kind, label in KINDS.items():
            run, base = run_name(kind, lever), run_name(kind, None)
            if _with(seeds, run, base):
                lines.append(_ratio_row(f"{label}: {what}", seeds, run, base))
    return lines


def kind_table(seeds: dict[str, dict]) -> list[str]:
    """TAPA's perplexity over NoPE's, lever by lever; the TAPA-only levers against the NoPE base."""
    lines = _ratio_header("TAPA / NoPE")
    lines[0] += " TAPA lower at 32x |"
    lines[1] += "---|"
    for lever, what in {None: "base (LLLG, w64)", **LEVERS}.items():
        tapa = run_name("tapa", lever)
        nope = run_name("nope", None if lever in TAPA_ONLY else lever)
        have = _with(seeds, tapa, nope)
        if not have:
            continue
        if lever in TAPA_ONLY:
            what += " (against the NoPE base)"
        lower = sum(seed[tapa][4096] < seed[nope][4096] for seed in have.values())
        lines.append(_ratio_row(what, seeds, tapa, nope) + f" {lower} of {len(have)} |")
    return lines


def anchor_table(seeds: dict[str, dict]) -> list[str]:
    """Each hybrid arm's perplexity over RoPE + YaRN's."""
    lines = _ratio_header("arm / RoPE + YaRN")
    for run, name in arms().items():
        if run != ANCHOR and _with(seeds, run, ANCHOR):
            lines.append(_ratio_row(name, seeds, run, ANCHOR))
    return lines


def summary(paths: list[str]) -> str:
    seeds = dict(zip((seed_name(path) for path in paths), load(paths)))
    sections = [
        ("Perplexity on the test split, mean of the seeds named (each seed's value in brackets, in "
         "that order); the last column is 32x over 1x.", perplexity_table(seeds)),
        ("Each lever over its own kind's base arm (mean of the seeds' ratios, each seed's ratio in "
         "brackets; below 1: the lever helps).", lever_table(seeds)),
        ("TAPA globals over NoPE globals, lever by lever (below 1: TAPA is lower).", kind_table(seeds)),
        ("Each hybrid arm over RoPE + YaRN continued alike (below 1.01: within 1% of it).",
         anchor_table(seeds)),
    ]
    return "\n\n".join(text + "\n\n" + "\n".join(lines) for text, lines in sections)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    print(summary(sys.argv[1:]))
