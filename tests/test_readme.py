"""The README runs and tells the truth: its Python quick starts run as written, and every number of
its headline (the 91M answer table and the numbers in the bullets under it) is the one the study's
aggregated files in results/toy-study hold. The toy study's zero-shot table is docs/study.md's,
checked here too."""

import csv
import re
import statistics
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
STUDY = ROOT / "results" / "toy-study"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
LENGTHS = {"512": 512, "1k": 1024, "2k": 2048, "4k": 4096, "8k": 8192, "16k": 16384}


def test_readme_has_python_examples():
    assert len(BLOCKS) >= 3


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


def _headline() -> str:
    """The README's headline section: from its study heading to the install section."""
    text = README.read_text()
    return text[text.index("## What we found"):text.index("## Install and run")]



def _prose(section: str) -> str:
    """The section's text with every run of whitespace (line breaks too) as one space."""
    return " ".join(section.split())


def _zero_shot(path: Path) -> dict:
    """(label, length) -> the zero-shot row of an aggregated perplexity.csv."""
    return {(r["label"], int(r["length"])): r for r in csv.DictReader(open(path))
            if r["stage"] == "zero-shot"}


def _passkey(path: Path, label: str) -> list[float]:
    """The arm's passkey accuracy in percent at 2k / 4k / 8k / 16k, the mean over depths of the
    per-depth means (seeds already averaged) in an aggregated passkey.csv, as passkey.md prints it."""
    by_length = defaultdict(list)
    for row in csv.DictReader(open(path)):
        if row["label"] == label:
            by_length[int(row["length"])].append(float(row["mean"]))
    assert sorted(by_length) == [2048, 4096, 8192, 16384], (label, sorted(by_length))
    return [100 * sum(v) / len(v) for _, v in sorted(by_length.items())]


def _numbers(text: str) -> list[str]:
    return re.findall(r"\d+(?:\.\d+)?", text)


def _match(pattern: str, text: str) -> re.Match:
    found = re.search(pattern, text)
    assert found, f"the README's headline no longer says {pattern!r}; update it and this test together"
    return found


def _check_study_table(section: str, where: str) -> int:
    """Every cell of the section's "| model | n | ..." table against results/toy-study/perplexity.csv
    (zero-shot): the seed count, the mean and, over 2+ seeds, the spread, as printed. An "lr" column,
    where there is one, must be the arm's learning rate. Returns the number of cells checked."""
    header = next(line for line in section.splitlines() if line.startswith("| model |"))
    names = [c.strip() for c in header.strip().strip("|").split("|")]
    first = next(i for i, name in enumerate(names) if name.split()[0] in LENGTHS)
    lengths = [LENGTHS[name.split()[0]] for name in names[first:]]
    rows = _zero_shot(STUDY / "perplexity.csv")
    checked = 0
    for line in section.splitlines():
        if not line.startswith("| ") or line.startswith(("| model", "|---")):
            continue
        cells = [c.strip().replace("*", "") for c in line.strip().strip("|").split("|")]
        assert len(cells) == len(names), (where, line)
        label = cells[0]
        for length, cell in zip(lengths, cells[first:]):
            assert (label, length) in rows, f"{where}: no zero-shot row for {label!r} at {length}"
            row = rows[(label, length)]
            mean, _, spread = cell.partition(" ± ")
            assert int(row["n"]) == int(cells[1]), (where, label, length)
            if "lr" in names:
                assert float(row["lr"]) == float(cells[names.index("lr")]), (where, label, row["lr"])
            assert _close_to_shown(float(row["mean"]), mean), (where, label, length, row["mean"], cell)
            if int(row["n"]) > 1:
                assert spread, (where, label, length, "a mean over seeds is shown with its spread")
                assert _close_to_shown(float(row["std"]), spread), (where, label, length, row["std"], cell)
            checked += 1
    return checked


# the answer table's rows: the scale step's arms (results/toy-study/scale-768, by label) and the
# globals confirmation's (results/toy-study/globals, by arm, one row per seed)
ANSWER_ROWS = {"RoPE, continued with YaRN": ("scale-768", "RoPE, continued with YaRN (s=4)"),
               "TAPA hybrid (LLLG, w256)": ("scale-768", "TAPA hybrid (LLLG, w256)"),
               "NoPE hybrid (LLLG, w256)": ("scale-768", "NoPE hybrid (LLLG, w256)"),
               "RoPE, continued with YaRN, 12-06": ("globals", "rope-yarn@768"),
               "TAPA hybrid + query temperature": ("globals", "hybrid-tapa-temp@768"),
               "NoPE hybrid + query temperature": ("globals", "hybrid-nope-temp@768")}


def _answer_sources(source: str, name: str) -> tuple[dict, float]:
    """(length -> (n, mean, std)) of the continual stage's test perplexity (std None for one seed),
    and the passkey accuracy at 8k in percent (over depths, then seeds), of one row of the answer
    table."""
    if source == "scale-768":
        scale = STUDY / "scale-768"
        perplexity = {int(r["length"]): (int(r["n"]), float(r["mean"]), float(r["std"]))
                      for r in csv.DictReader(open(scale / "perplexity.csv"))
                      if r["stage"] == "continual" and r["label"] == name}
        return perplexity, _passkey(scale / "passkey.csv", name)[2]
    seeds = _confirmation_perplexity(name)
    perplexity = {length: (len(v), statistics.mean(v), statistics.stdev(v) if len(v) > 1 else None)
                  for length, v in seeds.items()}
    passkey = _confirmation(name, "passkey", 8192, "accuracy")
    assert len(passkey) == len(seeds[8192]), (name, passkey)
    return perplexity, statistics.mean(passkey)


def _confirmation_perplexity(arm: str) -> dict:
    """length -> each seed's test perplexity after the continual stage, of one arm of the globals
    study."""
    seeds = defaultdict(list)
    for r in csv.DictReader(open(STUDY / "globals" / "perplexity.csv")):
        if r["arm"] == arm and r["stage"] == "continual" and r["data"] == "test":
            seeds[int(r["length"])].append(float(r["perplexity"]))
    return seeds


def _confirmation(arm: str, task: str, length: int, column: str) -> list[float]:
    """Each seed's value, in percent, of one retrieval cell of the globals study."""
    values = [100 * float(r[column]) for r in csv.DictReader(open(STUDY / "globals" / "retrieval.csv"))
              if r["arm"] == arm and r["task"] == task and r["length"] == str(length)]
    assert values, (arm, task, length)
    return values


def _scale_step_run(job: str) -> dict:
    """length -> the test perplexity after the continual stage of one job of the 2026-12-02 scale
    step (results/toy-study/scale-768/jobs.csv), e.g. 'rope-yarn:0.001:0'."""
    row = next(r for r in csv.DictReader(open(STUDY / "scale-768" / "jobs.csv")) if r["job"] == job)
    return {int(key.rsplit("_", 1)[1]): float(value) for key, value in row.items()
            if key.startswith("cont_ppl_") and value}


def test_readme_answer_table_matches_the_study_results():
    """The headline's first table (the globals study's answer at 91M) is the aggregated files': every
    row's seed count, perplexity mean and spread at each length (a one-seed row shows no spread),
    and its passkey mean at 8k."""
    section = _headline()
    header = next(line for line in section.splitlines() if line.startswith("| model (91M"))
    names = [c.strip() for c in header.strip().strip("|").split("|")]
    lengths = [LENGTHS[name.split()[0]] for name in names[2:-1]]
    checked = set()
    for line in section.splitlines():
        if not line.startswith("| ") or line.startswith(("| model", "|---")):
            continue
        cells = [c.strip().replace("*", "") for c in line.strip().strip("|").split("|")]
        assert len(cells) == len(names) and cells[0] in ANSWER_ROWS, line
        perplexity, passkey = _answer_sources(*ANSWER_ROWS[cells[0]])
        for length, cell in zip(lengths, cells[2:-1]):
            n, mean, std = perplexity[length]
            shown_mean, _, shown_std = cell.partition(" ± ")
            assert n == int(cells[1]), (cells[0], length, n)
            assert _close_to_shown(mean, shown_mean), (cells[0], length, mean, cell)
            if n == 1:
                assert not shown_std, (cells[0], length, cell)
            else:
                assert _close_to_shown(std, shown_std), (cells[0], length, std, cell)
        assert _close_to_shown(passkey, cells[-1]), (cells[0], passkey, cells[-1])
        checked.add(cells[0])
    assert checked == set(ANSWER_ROWS)


def test_readme_answer_bullets_match_the_study_results():
    """The 91M bullets under the answer table: NoPE's lead on the means at 512 and 16k, where the
    seeds overlap, single-key beyond the window at 4k, the same-day RoPE + YaRN ratios and
    retrieval, and the caption's moves of RoPE + YaRN and the NoPE base between the two dates."""
    text = _prose(_headline())
    tapa, _ = _answer_sources("globals", "hybrid-tapa-temp@768")
    nope, _ = _answer_sources("globals", "hybrid-nope-temp@768")
    rope, _ = _answer_sources("globals", "rope-yarn@768")
    lead = _match(r"lower on the mean at every length \((\d+\.\d)% at 512, (\d+\.\d)% at 16k\)", text)
    for length, shown in zip((512, 16384), lead.groups()):
        assert _close_to_shown(100 * (1 - nope[length][1] / tapa[length][1]), shown), (length, shown)
    assert all(nope[length][1] < tapa[length][1] for length in nope)
    tapa_seeds, nope_seeds = (_confirmation_perplexity(f"hybrid-{kind}-temp@768") for kind in ("tapa", "nope"))
    overlap = [length for length in sorted(tapa_seeds) if min(tapa_seeds[length]) < max(nope_seeds[length])]
    assert "from 4k on TAPA's best seed is below NoPE's worst" in text and overlap[0] == 4096, overlap
    assert overlap == [length for length in sorted(tapa_seeds) if length >= 4096], overlap

    single = _match(r"single-key at 4k: (\d+)% against (\d+)%", text)
    for arm, shown in zip(("hybrid-nope-temp@768", "hybrid-tapa-temp@768"), single.groups()):
        assert _close_to_shown(statistics.mean(_confirmation(arm, "single-key", 4096, "far_accuracy")), shown), (arm, shown)
    ratio = _match(r"x(\d\.\d\d) at 512 to x(\d\.\d\d) at 16k", text)
    for length, shown in zip((512, 16384), ratio.groups()):
        assert _close_to_shown(nope[length][1] / rope[length][1], shown), (length, shown)
    passkey = _match(r"finds more passkeys \((\d+) against (\d+)% at 8k\)", text)
    for arm, shown in zip(("rope-yarn@768", "hybrid-nope-temp@768"), passkey.groups()):
        assert _close_to_shown(statistics.mean(_confirmation(arm, "passkey", 8192, "accuracy")), shown), (arm, shown)
    # the caption: RoPE + YaRN's seed 0 under the confirmation against its 2026-12-02 run
    earlier = _scale_step_run("rope-yarn:0.001:0")
    drops = [100 * (1 - rope[length][1] / earlier[length]) for length in sorted(rope)]
    moved = _match(r"RoPE \+ YaRN's seed 0 run again \(row 4\) is (\d\.\d)-(\d\.\d)% lower than on 12-02", text)
    assert all(d > 0 for d in drops) and len(drops) == 6, drops
    assert _close_to_shown(min(drops), moved.group(1)) and _close_to_shown(max(drops), moved.group(2)), drops
    # and the NoPE base's seed 0, run again under the confirmation, against its 2026-12-02 run
    base = _confirmation_perplexity("hybrid-nope@768")
    earlier = _scale_step_run("hybrid-nope:0.001:0")
    moves = [abs(base[length][0] / earlier[length] - 1) for length in sorted(base)]
    within = _match(r"the NoPE base's, within (\d\.\d)%", text)
    assert len(moves) == 6 and all(len(base[length]) == 1 for length in base), base
    assert _close_to_shown(100 * max(moves), within.group(1)), moves
    single_rope = _match(r"fewer single keys past 256 tokens \((\d+) against (\d+)% at 4k\)", text)
    for arm, shown in zip(("rope-yarn@768", "hybrid-nope-temp@768"), single_rope.groups()):
        assert _close_to_shown(statistics.mean(_confirmation(arm, "single-key", 4096, "far_accuracy")), shown), (arm, shown)


def test_study_doc_table_matches_the_study_results():
    """docs/study.md's zero-shot table (every arm) is the aggregated study's too."""
    text = (ROOT / "docs" / "study.md").read_text()
    section = text[text.index("## Zero-shot perplexity"):text.index("## What it says")]
    assert _check_study_table(section, "docs/study.md") >= 60


def test_readme_headline_gaps_match_the_study_results():
    """The two gaps the bullets quote: the hybrids' in-length gap to RoPE, plain TAPA's."""
    text = _prose(_headline())
    rows = _zero_shot(STUDY / "perplexity.csv")
    rope = float(rows[("RoPE", 512)]["mean"])
    hybrids = [float(rows[(f"{kind} hybrid (LLLG, w256)", 512)]["mean"]) for kind in ("TAPA", "NoPE")]
    hybrids.append(float(rows[("RoPE hybrid (LLLG, w256) + eval-time YaRN", 512)]["mean"]))
    gap = _match(r"within (\d+\.\d)% of RoPE at the training length", text).group(1)
    worst = 100 * (max(hybrids) / rope - 1)  # 1.51; from the table's rounded means, 1.58
    assert worst <= float(gap) < worst + 0.15, (hybrids, rope, gap)
    tapa_gap = _match(r"Plain TAPA is (\d+)% worse than RoPE in length", text).group(1)
    assert _close_to_shown(100 * (float(rows[("TAPA", 512)]["mean"]) / rope - 1), tapa_gap)


def test_readme_headline_passkey_matches_the_study_results():
    """The bullets' passkey numbers (toy study, after the x0.1 continual stage). The scale step's
    zero-shot numbers left the README for docs/study.md's table, checked below."""
    text = _prose(_headline())
    toy = _match(r"passkey retrieval at 2k-16k is ([\d / ]+)% through TAPA globals, ([\d / ]+)% through "
                 r"NoPE globals", text)
    for shown, label in zip(toy.groups(), ("TAPA", "NoPE")):
        expected = _passkey(STUDY / "passkey.csv", f"{label} hybrid (LLLG, w256) [continual lr x0.1]")
        assert len(_numbers(shown)) == 4
        for value, cell in zip(expected, _numbers(shown)):
            assert _close_to_shown(value, cell), (label, expected, shown)


def test_study_doc_scale_step_table_matches_the_study_results():
    """docs/study.md's scale-step table: zero-shot and continual perplexity at 512 / 2k / 16k and
    passkey at 2k-16k, from results/toy-study/scale-768."""
    text = (ROOT / "docs" / "study.md").read_text()
    section = text[text.index("## The scale step"):text.index("## Answers")]
    scale = STUDY / "scale-768"
    stages = {(r["stage"], r["label"], int(r["length"])): r for r in csv.DictReader(open(scale / "perplexity.csv"))}
    names = {"RoPE, continued with YaRN": "RoPE, continued with YaRN (s=4)"}
    checked = 0
    for line in section.splitlines():
        if not line.startswith("| ") or line.startswith(("| model", "|---")):
            continue
        label, n, zero_shot, continual, passkey = (c.strip() for c in line.strip().strip("|").split("|"))
        label = names.get(label, label)
        for stage, cell in (("zero-shot", zero_shot), ("continual", continual)):
            for length, shown in zip((512, 2048, 16384), filter(None, cell.split(" / "))):
                row = stages[(stage, label, length)]
                mean, _, spread = shown.partition(" ± ")
                assert int(row["n"]) == int(n), (label, stage, length)
                assert _close_to_shown(float(row["mean"]), mean), (label, stage, length, row["mean"], shown)
                if spread:
                    assert _close_to_shown(float(row["std"]), spread), (label, stage, length, row["std"], shown)
                checked += 1
        for value, shown in zip(_passkey(scale / "passkey.csv", label), _numbers(passkey)):
            assert _close_to_shown(value, shown), (label, value, passkey)
            checked += 1
    assert checked >= 30


def test_study_readme_tables_are_the_aggregated_ones():
    """results/toy-study/README.md is hand-kept around generated tables: its coverage, seed
    comparison and theory tables must be coverage.md's, comparisons.md's and theory_trained.md's
    (re-aggregating after new jobs without updating the README fails here)."""
    readme = (STUDY / "README.md").read_text()
    for name in ("coverage.md", "comparisons.md", "theory_trained.md"):
        table = (STUDY / name).read_text().strip()
        assert table.split("\n\n")[0 if name == "coverage.md" else 1] in readme, name
