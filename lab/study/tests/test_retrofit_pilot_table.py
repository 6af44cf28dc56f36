"""The retrofit pilot's summary: per-arm means over seeds, each seed's value, the 32x / 1x ratio,
the RoPE run's eval-time row kept apart, arms missing from a seed left out."""

from lab.study.retrofit_pilot_table import arm_perplexities, summary


def _results(values: dict) -> dict:
    methods = []
    for (run, pe, trained), (short, long) in values.items():
        methods.append({"run": run, "pe": pe, "trained_pe": trained,
                        "perplexity": [{"length": 128, "perplexity": short},
                                       {"length": 4096, "perplexity": long}]})
    return {"methods": methods}


def test_means_seeds_and_ratio(tmp_path):
    import json

    seeds = [{("rope", "rope", "rope"): (40.0, 100.0), ("rope", "rope-yarn", "rope"): (40.0, 80.0),
              ("retrofit-tapa", "tapa", "tapa"): (50.0, 49.0)},
             {("rope", "rope", "rope"): (42.0, 96.0), ("rope", "rope-yarn", "rope"): (42.0, 76.0),
              ("retrofit-tapa", "tapa", "tapa"): (52.0, 52.0), ("hybrid-tapa-c", "tapa", "tapa"): (1.0, 1.0)}]
    paths = []
    for index, seed in enumerate(seeds):
        path = tmp_path / f"seed{index}.json"
        path.write_text(json.dumps(_results(seed)))
        paths.append(str(path))
    assert set(arm_perplexities(_results(seeds[0]))) == {"rope", "rope+rope-yarn", "retrofit-tapa"}
    lines = summary(paths).splitlines()
    assert lines[0] == "| arm | 128 | 4096 | longest / shortest |"
    assert lines[2] == "| RoPE (pretrained, zero-shot) | 41.00 (40.00 / 42.00) | 98.00 (100.00 / 96.00) | 2.39 |"
    assert lines[3].startswith("| RoPE + eval-time YaRN (zero-shot) | 41.00 ")
    assert lines[4].endswith("| 50.50 (49.00 / 52.00) | 0.99 |")
    assert len(lines) == 5  # the hybrid from scratch is in one seed only


def test_the_pilot_readme_shows_the_summary_it_ships():
    """results/retrofit/cpu-pilot/README.md's table is summary.md's, and summary.md is what the
    seeds' reports give."""
    from pathlib import Path

    folder = Path(__file__).resolve().parents[3] / "results" / "retrofit" / "cpu-pilot"
    seeds = sorted(str(path) for path in folder.glob("seed*/results.json"))
    table = summary(seeds)
    assert (folder / "summary.md").read_text().strip() == table
    assert table in (folder / "README.md").read_text()
