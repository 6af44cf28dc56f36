"""Passkey retrieval beyond the local window, from an aggregated passkey table:

    python3 -m lab.study.far_passkey results/toy-study/passkey.csv results/toy-study/scale-768/passkey.csv

reads the toy study's passkey.csv files (lab.study.aggregate: per arm, length and depth, the mean
and the standard deviation over seeds of the accuracy) and prints, for each hybrid arm (and the
RoPE + YaRN arms beside them), the mean accuracy over every depth, over the depths whose key lies
beyond the local window (`tapa.eval.tasks.beyond_window`: only the global layers can retrieve it),
and at depth 1.0 (next to the question, in every model's reach), per length. Those runs' job JSONs
are not kept in the tree, so the seeds' spread of the pooled accuracy cannot be computed; the
table gives the largest per-cell standard deviation over seeds among the cells beyond the window.
"""

from __future__ import annotations

import argparse
import csv
from collections import defaultdict
from pathlib import Path

from tapa.eval.tasks import beyond_window

WINDOW = 256  # the study's hybrids (LLLG, w256)


def far_rows(path: str | Path, window: int = WINDOW) -> list[dict]:
    """A row per (arm, length) of a passkey.csv: mean accuracy in % over every depth, beyond the
    window and at the last depth, the seeds, and the largest seed std of a cell beyond the window."""
    cells = defaultdict(list)
    with open(path, newline="") as handle:
        for r in csv.DictReader(handle):
            if "hybrid" in r["arm"] or r["arm"].startswith("rope-yarn"):
                cells[(r["arm"], r["label"], int(r["seeds"]), int(r["length"]))].append(
                    (float(r["depth"]), float(r["mean"]), float(r["std"] or "nan")))
    rows = []
    for (arm, label, seeds, length), found in cells.items():
        far = [(mean, std) for depth, mean, std in found if beyond_window(length, depth, window)]
        last = max(found)
        rows.append({"arm": arm, "label": label, "seeds": seeds, "length": length,
                     "all": 100 * sum(m for _, m, _ in found) / len(found),
                     "far": 100 * sum(m for m, _ in far) / len(far) if far else float("nan"),
                     "far_std_max": 100 * max((s for _, s in far if s == s), default=float("nan")),
                     "last_depth": last[0], "last": 100 * last[1]})
    return rows


def markdown(rows: list[dict], window: int = WINDOW) -> str:
    lengths = sorted({r["length"] for r in rows})
    lines = [f"Passkey % correct beyond the {window}-token window (mean over seeds; in brackets the "
             "largest seed std of a cell there), then over every depth and at the last depth",
             "", "| arm | seeds | " + " | ".join(f"{n} beyond / all / last" for n in lengths) + " |",
             "|---|---|" + "---|" * len(lengths)]
    found = {(r["arm"], r["length"]): r for r in rows}
    for arm, label, seeds in dict.fromkeys((r["arm"], r["label"], r["seeds"]) for r in rows):
        cells = []
        for n in lengths:
            r = found.get((arm, n))
            spread = "" if r is None or r["far_std_max"] != r["far_std_max"] else f" (±{r['far_std_max']:.0f})"
            cells.append("" if r is None else f"{r['far']:.0f}{spread} / {r['all']:.0f} / {r['last']:.0f}")
        lines.append(f"| {label} | {seeds} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m lab.study.far_passkey", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="+", help="passkey.csv files of lab.study.aggregate")
    parser.add_argument("--window", type=int, default=WINDOW, help="local window in tokens (default %(default)s)")
    args = parser.parse_args(argv)
    for path in args.paths:
        try:
            rows = far_rows(path, args.window)
        except (OSError, KeyError, ValueError) as err:
            raise SystemExit(f"lab.study.far_passkey: {path}: {err}") from err
        print(f"{path}\n\n{markdown(rows, args.window)}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
