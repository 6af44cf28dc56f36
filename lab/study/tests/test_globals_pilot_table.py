"""The globals pilot's summary: per-arm means over seeds with each seed's value, each lever over its
own kind's base arm, TAPA over NoPE lever by lever (TAPA's own levers against the NoPE base), each
arm over RoPE + YaRN; arms missing from a seed left out; and the shipped README's table."""

import json
from pathlib import Path

import pytest

from lab.study.globals_pilot_table import arms, run_name, seed_name, summary

LENGTHS = (128, 256, 512, 1024, 2048, 4096)


def _results(runs: dict) -> dict:
    """A `tapa report` results.json: run -> perplexity at 1x, the same to 8x, then 16x and 32x."""
    methods = []
    for run, (short, mid, long) in runs.items():
        values = dict(zip(LENGTHS, (short, short, short, short, mid, long)))
        methods.append({"run": run, "pe": "x", "trained_pe": "x",
                        "perplexity": [{"length": n, "perplexity": v} for n, v in values.items()]})
    return {"methods": methods}


def _write(tmp_path, seeds) -> list[str]:
    paths = []
    for index, runs in enumerate(seeds):
        path = tmp_path / f"seed{index}.json"
        path.write_text(json.dumps(_results(runs)))
        paths.append(str(path))
    return paths


def test_run_names_and_arms():
    assert run_name("tapa", None) == "hybrid-tapa-c"
    assert run_name("nope", "c1024") == "hybrid-nope-c1024"
    assert run_name("tapa", "w16") == "hybrid-tapa-w16-c"
    table = arms()
    assert list(table)[:3] == ["rope-yarn", "hybrid-tapa-c", "hybrid-nope-c"]
    assert "hybrid-tapa-theta25-c" in table and "hybrid-nope-theta25-c" not in table
    assert len(table) == 3 + 2 * 6 + 6  # anchor, 2 bases, 6 levers on both kinds, 6 TAPA-only


def test_seed_names():
    assert seed_name("results/x/seed1/results.json") == "1"
    assert seed_name("/tmp/seed2.json") == "2"


def test_the_four_tables(tmp_path):
    seeds = [{"rope-yarn": (50.0, 60.0, 100.0),
              "hybrid-tapa-c": (40.0, 40.0, 40.0), "hybrid-nope-c": (40.0, 40.0, 50.0),
              "hybrid-tapa-w16-c": (44.0, 36.0, 20.0), "hybrid-nope-w16-c": (40.0, 40.0, 40.0),
              "hybrid-tapa-theta25-c": (40.0, 40.0, 60.0),
              "hybrid-tapa-l5g-c": (20.0, 20.0, 20.0)},  # in seed 0 only, without its NoPE twin
             {"rope-yarn": (50.0, 60.0, 100.0),
              "hybrid-tapa-c": (40.0, 40.0, 40.0), "hybrid-nope-c": (40.0, 40.0, 40.0),
              "hybrid-tapa-w16-c": (40.0, 40.0, 60.0), "hybrid-nope-w16-c": (40.0, 40.0, 40.0),
              "hybrid-tapa-theta25-c": (40.0, 40.0, 40.0)}]
    text = summary(_write(tmp_path, seeds))
    sections = text.split("\n\n")
    assert sections[0].startswith("Perplexity on the test split, mean of the seeds named")
    perplexity = sections[1].splitlines()
    assert perplexity[0] == ("| arm | seeds | 128 | 256 | 512 | 1024 | 2048 | 4096 "
                             "| longest / shortest |")
    assert perplexity[2].startswith("| RoPE + YaRN, continued (anchor) | 0, 1 | 50.00 (50.00 / 50.00) |")
    assert perplexity[4] == ("| NoPE hybrid, base (LLLG, w64) | 0, 1 | "
                             + " | ".join(["40.00 (40.00 / 40.00)"] * 5) + " | 45.00 (50.00 / 40.00) | 1.12 |")
    # the arm of seed 0 only, with its one seed (LLLLLG comes before theta in the levers' order)
    assert perplexity[7] == ("| TAPA hybrid, LLLLLG (6 layers) | 0 | " + " | ".join(["20.00 (20.00)"] * 6)
                             + " | 1.00 |")
    assert perplexity[8].startswith("| TAPA hybrid, theta 0.25 | 0, 1 |") and len(perplexity) == 9

    levers = sections[3].splitlines()
    assert levers[0] == ("| lever / its kind's base | seeds | 1x (128) | 8x (1024) | 16x (2048) "
                         "| 32x (4096) |")
    # TAPA w16 over the TAPA base: 1.1 / 1.0 at 1x, 0.9 / 1.0 at 16x, 0.5 / 1.5 at 32x
    assert levers[2] == ("| TAPA: window 16 | 0, 1 | 1.050 (1.100 / 1.000) | 1.050 (1.100 / 1.000) "
                         "| 0.950 (0.900 / 1.000) | 1.000 (0.500 / 1.500) |")
    assert levers[3].startswith("| NoPE: window 16 | 0, 1 | 1.000 (1.000 / 1.000) |")
    assert levers[3].endswith("| 0.900 (0.800 / 1.000) |")  # its base is 50 at 32x on seed 0
    assert levers[4].startswith("| TAPA: LLLLLG (6 layers) | 0 | 0.500 (0.500) |")
    assert levers[5].startswith("| TAPA: theta 0.25 | 0, 1 |") and len(levers) == 6

    kinds = sections[5].splitlines()
    assert kinds[0].endswith("| 32x (4096) | TAPA lower at 32x |")
    assert kinds[2] == ("| base (LLLG, w64) | 0, 1 | 1.000 (1.000 / 1.000) | 1.000 (1.000 / 1.000) "
                        "| 1.000 (1.000 / 1.000) | 0.900 (0.800 / 1.000) | 1 of 2 |")
    assert kinds[3].startswith("| window 16 | 0, 1 | 1.050 (1.100 / 1.000) |")
    assert kinds[3].endswith("| 1.000 (0.500 / 1.500) | 1 of 2 |")
    # LLLLLG has no NoPE twin: no row; theta against the NoPE base: 60 / 50 and 40 / 40 at 32x
    assert kinds[4] == ("| theta 0.25 (against the NoPE base) | 0, 1 | 1.000 (1.000 / 1.000) "
                        "| 1.000 (1.000 / 1.000) | 1.000 (1.000 / 1.000) | 1.100 (1.200 / 1.000) | 0 of 2 |")
    assert len(kinds) == 5

    anchor = sections[7].splitlines()
    assert anchor[2] == ("| TAPA hybrid, base (LLLG, w64) | 0, 1 | 0.800 (0.800 / 0.800) "
                         "| 0.800 (0.800 / 0.800) | 0.667 (0.667 / 0.667) | 0.400 (0.400 / 0.400) |")
    assert len(anchor) == 2 + 6


def test_the_pilot_readme_shows_the_summary_it_ships():
    """results/toy-study/globals/cpu-pilot/README.md holds summary.md, and summary.md is what the
    committed seeds' reports give."""
    folder = Path(__file__).resolve().parents[3] / "results" / "toy-study" / "globals" / "cpu-pilot"
    seeds = sorted(str(path) for path in folder.glob("seed*/results.json"))
    if not seeds:
        pytest.skip("no seed of the pilot committed yet")
    table = summary(seeds)
    assert (folder / "summary.md").read_text().strip() == table
    assert table in (folder / "README.md").read_text()
