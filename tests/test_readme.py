"""The README's Python quick starts run as written."""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_has_python_examples():
    assert len(BLOCKS) >= 2


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_python_block_runs(index):
    exec(compile(BLOCKS[index], f"README.md block {index}", "exec"), {})


def test_cli_version_and_help(capsys):
    from tapa.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert "tapa" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["no-such-command"])


def _close_to_shown(value: float, shown: str) -> bool:
    """`value` rounds to `shown` as the README prints it ("8.27", "103", "4.3e5")."""
    if "e" in shown:
        return abs(value / float(shown) - 1) < 0.06
    decimals = len(shown.split(".")[1]) if "." in shown else 0
    return abs(value - float(shown)) <= 0.5 * 10 ** -decimals + 1e-9


def test_readme_study_table_matches_the_study_results():
    """The README's first table is copied from results/toy-study: every mean, spread and seed
    count must still be what the aggregated study says (a re-aggregation that moves a number
    fails here until the README follows)."""
    import csv

    text = README.read_text()
    section = text[text.index("## What we measured"):text.index("## Install and run")]
    header = next(line for line in section.splitlines() if line.startswith("| model |"))
    lengths = [{"1k": 1024, "2k": 2048, "4k": 4096, "8k": 8192, "16k": 16384}.get(c.split()[0], None)
               or int(c.split()[0]) for c in header.strip("|").split("|")[3:]]
    labels = {"TAPA (phase rows at 0.1x lr)": "TAPA"}
    study = Path(__file__).resolve().parents[1] / "results" / "toy-study" / "perplexity.csv"
    rows = {(r["label"], int(r["length"])): r for r in csv.DictReader(open(study))
            if r["stage"] == "zero-shot"}
    checked = 0
    for line in section.splitlines():
        cells = [c.strip().replace("*", "") for c in line.strip("|").split("|")]
        if not line.startswith("| ") or line.startswith(("| model", "|---")) or len(cells) < 4:
            continue
        label = labels.get(cells[0], cells[0])
        for length, cell in zip(lengths, cells[3:]):
            row = rows[(label, length)]
            mean, _, spread = cell.partition(" ± ")
            assert int(row["n"]) == int(cells[1]), (label, length)
            assert _close_to_shown(float(row["mean"]), mean), (label, length, row["mean"], cell)
            if spread:
                assert _close_to_shown(float(row["std"]), spread), (label, length, row["std"], cell)
            checked += 1
    assert checked >= 30


def test_study_readme_tables_are_the_aggregated_ones():
    """results/toy-study/README.md is hand-kept around generated tables: its coverage, seed
    comparison and theory tables must be coverage.md's, comparisons.md's and theory_trained.md's
    (re-aggregating after new jobs without updating the README fails here)."""
    study = Path(__file__).resolve().parents[1] / "results" / "toy-study"
    readme = (study / "README.md").read_text()
    for name in ("coverage.md", "comparisons.md", "theory_trained.md"):
        table = (study / name).read_text().strip()
        assert table.split("\n\n")[0 if name == "coverage.md" else 1] in readme, name
