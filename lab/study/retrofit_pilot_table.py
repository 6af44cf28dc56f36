"""The retrofit CPU pilot's summary (lab/study/retrofit_cpu_pilot.sh): from one `tapa report`
results.json per seed, the mean perplexity of each arm at each length over the seeds, each seed's
value beside it, and the longest length over the shortest.

    python3 -m lab.study.retrofit_pilot_table SEED0/results.json SEED1/results.json > summary.md
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

# run directory -> the arm's name in the summary, in the order of the table
ARMS = {
    "rope": "RoPE (pretrained, zero-shot)",
    "rope+rope-yarn": "RoPE + eval-time YaRN (zero-shot)",
    "convert-tapa": "converted to the TAPA hybrid, not trained",
    "convert-nope": "converted to the NoPE hybrid, not trained",
    "rope-yarn": "RoPE + YaRN, continued",
    "retrofit-tapa": "retrofit: converted to the TAPA hybrid, continued",
    "retrofit-nope": "retrofit: converted to the NoPE hybrid, continued",
    "hybrid-tapa-c": "TAPA hybrid from scratch, continued",
    "hybrid-nope-c": "NoPE hybrid from scratch, continued",
    # the continual lr lever (the stage above runs at 0.1x the pretraining peak)
    "rope-yarn-lr0.3": "RoPE + YaRN, continued at 0.3x the lr",
    "retrofit-tapa-lr0.3": "retrofit, TAPA hybrid, continued at 0.3x the lr",
    "retrofit-nope-lr0.3": "retrofit, NoPE hybrid, continued at 0.3x the lr",
    "rope-yarn-lr1": "RoPE + YaRN, continued at 1x the lr",
    "retrofit-tapa-lr1": "retrofit, TAPA hybrid, continued at 1x the lr",
    "retrofit-nope-lr1": "retrofit, NoPE hybrid, continued at 1x the lr",
    # the stage-length lever: the stage 4x as long (20% of pretraining), at 0.1x the lr
    "rope-yarn-cl20": "RoPE + YaRN, continued 4x as long (20%)",
    "retrofit-tapa-cl20": "retrofit, TAPA hybrid, continued 4x as long (20%)",
    "retrofit-nope-cl20": "retrofit, NoPE hybrid, continued 4x as long (20%)",
}


def arm_perplexities(results: dict) -> dict[str, dict[int, float]]:
    """{arm: {length: perplexity}} of one report; a run's eval-time scaling row is RUN+RULE."""
    table = {}
    for method in results["methods"]:
        arm = method["run"]
        if method.get("pe") != method.get("trained_pe"):  # eval-time scaling of the RoPE weights
            arm += f"+{method['pe']}"
        table[arm] = {row["length"]: row["perplexity"] for row in method["perplexity"]}
    return table


def load(paths: list[str]) -> list[dict[str, dict[int, float]]]:
    """arm_perplexities of each seed's results.json, in the order given."""
    return [arm_perplexities(json.loads(Path(path).read_text())) for path in paths]


def fmt(values: list[float], digits: int = 2) -> str:
    """The mean of the seeds' values, then each seed's value: '41.00 (40.00 / 42.00)'."""
    return f"{sum(values) / len(values):.{digits}f} ({' / '.join(f'{v:.{digits}f}' for v in values)})"


def perplexity_table(seeds: list[dict], arms: dict[str, str]) -> list[str]:
    """One row per arm present in every seed: the mean perplexity at each length with each seed's
    value, and the mean over the seeds of the longest length over the shortest."""
    lengths = sorted(next(iter(seeds[0].values())))
    lines = ["| arm | " + " | ".join(str(n) for n in lengths) + " | longest / shortest |",
             "|---|" + "---|" * (len(lengths) + 1)]
    for run, name in arms.items():
        if not all(run in seed for seed in seeds):
            continue
        cells = [fmt([seed[run][length] for seed in seeds]) for length in lengths]
        ratios = [seed[run][lengths[-1]] / seed[run][lengths[0]] for seed in seeds]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {sum(ratios) / len(ratios):.2f} |")
    return lines


def summary(paths: list[str]) -> str:
    return "\n".join(perplexity_table(load(paths), ARMS))


if __name__ == "__main__":
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    print(summary(sys.argv[1:]))
