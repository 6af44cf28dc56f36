"""Issue 37's screen machinery: the second text domain (lab/study/domain.py), the runner's domain
and retrieval stages (lab/study/plan.py, run.py), and the screen's tables (lab/study/screen.py)."""

import csv
import io
import os
import json
import tarfile
from email.message import Message
from pathlib import Path

import pytest

from lab.study import arms, domain, plan, run, screen


class FakeDistribution:
    def __init__(self, name, version, text, kind="text/markdown"):
        self.metadata = Message()
        self.metadata["Name"], self.metadata["Version"] = name, version
        self.metadata["Description-Content-Type"] = kind
        self.metadata.set_payload(text)


def test_domain_keeps_long_distinct_descriptions(tmp_path, monkeypatch):
    prose = "A sentence about a package. " * 100
    dists = [FakeDistribution("beta", "1.0", prose), FakeDistribution("Alpha", "2.0", prose + "more"),
             FakeDistribution("beta-copy", "1.0", prose),  # the same text: kept once
             FakeDistribution("short", "0.1", "too short"),
             FakeDistribution("rst", "3", prose * 2, kind="text/x-rst; charset=UTF-8")]
    monkeypatch.setattr(domain.importlib.metadata, "distributions", lambda: dists)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "stale.md").write_text("left by an earlier build")
    manifest = domain.build(tmp_path / "docs", min_bytes=1000)
    assert manifest["names"] == ["alpha-2.0.md", "beta-1.0.md", "rst-3.rst"]
    assert sorted(p.name for p in (tmp_path / "docs").iterdir()) == manifest["names"]
    assert (tmp_path / "docs" / "rst-3.rst").read_text() == prose * 2
    assert manifest["bytes"] == len(prose * 4) + len("more")
    assert json.loads((tmp_path / "docs.json").read_text())["sha256"] == manifest["sha256"]
    stamps = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "docs").iterdir()}
    (tmp_path / "docs" / "beta-1.0.md").touch()
    stamps["beta-1.0.md"] = (tmp_path / "docs" / "beta-1.0.md").stat().st_mtime_ns
    again = domain.build(tmp_path / "docs", min_bytes=1000)
    assert again["sha256"] == manifest["sha256"]  # the same packages, the same text
    # ... left as it was: another runner of a multi-GPU call may be reading it
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "docs").iterdir()} == stamps
    dists[1] = FakeDistribution("Alpha", "2.1", prose + "changed")
    changed = domain.build(tmp_path / "docs", min_bytes=1000)
    assert changed["sha256"] != manifest["sha256"] and "alpha-2.1.md" in changed["names"]
    assert sorted(p.name for p in (tmp_path / "docs").iterdir()) == changed["names"]
    monkeypatch.setattr(domain.importlib.metadata, "distributions", lambda: dists[3:4])
    with pytest.raises(ValueError, match="no installed distribution"):
        domain.build(tmp_path / "none", min_bytes=1000)


def test_screen_plan_has_domain_stages_and_shares_pretraining():
    jobs = plan.parse_jobs("hybrid-tapa:0.001:0,hybrid-tapa-pk10:0.001:0,hybrid-nope-w64:0.001:0")
    groups = plan.build_groups(jobs, arms.TOY_GPU_SCREEN, list(arms.STAGES), Path("/r"))
    # pk10 changes the continual stage only: it shares hybrid-tapa's pretraining run
    assert [g.id for g in groups] == ["hybrid-tapa-lr0.001-s0", "hybrid-nope-w64-lr0.001-s0"]
    tapa = groups[0]
    names = [s.name for s in tapa.stages]
    assert {"domain0", "domain1-hybrid-tapa", "domain1-hybrid-tapa-pk10"} <= set(names)
    assert names.index("domain1-hybrid-tapa") > names.index("continual-hybrid-tapa")
    argv = tapa.stage("domain1-hybrid-tapa").argv
    assert argv[argv.index("--data") + 1] == "/r/domain/package-docs" and "--split" not in argv
    assert argv[argv.index("--lengths") + 1] == "512,1024,2048,4096,8192,16384"
    passkey = tapa.stage("passkey-hybrid-tapa")
    assert passkey.argv[passkey.argv.index("--tasks") + 1] == "all"
    # 4 tasks x 4 lengths x 5 depths x 77 trials (+-5 points a length)
    assert passkey.prompts == 4 * 4 * 5 * 77
    estimate = plan.estimate_stage(passkey, arms.Estimates(), 1)
    assert estimate == pytest.approx(arms.Estimates().passkey_s_per_method + 6160 * arms.Estimates().task_s_per_prompt)
    # a protocol without a domain plans no domain stage
    plain = plan.build_groups(jobs[:1], arms.TOY_GPU, list(arms.STAGES), Path("/r"))
    assert not [s for s in plain[0].stages if s.kind in arms.DOMAIN_STAGES]


def test_retrofit_converts_the_rope_run_then_continues_from_the_converted_model():
    jobs = plan.parse_jobs("rope:0.001:0,retrofit-tapa:0.001:0,retrofit-nope:0.001:0")
    (group,) = plan.build_groups(jobs, arms.TOY_GPU_SCREEN, list(arms.STAGES), Path("/r"))
    names = [s.name for s in group.stages]
    assert names.count("pretrain") == 1  # the retrofits read the RoPE arm's pretraining
    for kind in ("tapa", "nope"):
        convert, continual = group.stage(f"convert-retrofit-{kind}"), group.stage(f"continual-retrofit-{kind}")
        assert names.index(convert.name) < names.index(continual.name)
        assert convert.argv[:3] == ["convert", "/r/runs/rope-lr0.001-s0/pretrain", convert.out]
        argv = continual.argv
        assert argv[argv.index("--init-from") + 1] == convert.out
        assert argv[argv.index("--data") + 1] == "builtin"  # the toy-gpu recipe's source
        assert len(argv) - argv[::-1].index("--pe") == argv.index(kind)  # the last --pe wins
        assert continual.needs == ["pretrain", convert.name]
        assert plan.job_stages(plan.Job(f"retrofit-{kind}", 0.001, 0), arms.stages_of(arms.TOY_GPU_SCREEN)) == [
            "pretrain", convert.name, continual.name, f"eval1-retrofit-{kind}",
            f"domain1-retrofit-{kind}", f"passkey-retrofit-{kind}"]
    assert screen.base_of("retrofit-tapa") == "hybrid-tapa" and screen.base_of("retrofit-nope") == "hybrid-nope"
    assert plan.check_flags([group]) == []  # every command parses with this checkout's tapa
    # the longer-stage lever: the same stage at 4x the steps, 20% of pretraining
    (longer,) = plan.build_groups(jobs, arms.TOY_GPU_CL20, list(arms.STAGES), Path("/r"))
    stage = longer.stage("continual-retrofit-tapa")
    assert stage.argv[stage.argv.index("--steps") + 1] == "612" and stage.tokens == 612 * 16 * 2048
    assert round(stage.tokens / arms.TOY_GPU_CL20.pretrain_tokens, 2) == 0.2
    assert arms.TOY_GPU_CL20.fingerprint() != arms.TOY_GPU_SCREEN.fingerprint()


def test_confirmation_protocol_is_the_scale_step_with_the_screens_evaluations():
    """scale-768-confirm trains scale-768's 91M model and evaluates like the screen: the second
    domain before and after the continual stage, the retrieval suite beside the passkey grid."""
    jobs = [plan.Job("hybrid-tapa-theta75", 0.001, 0)]
    (group,) = plan.build_groups(jobs, arms.SCALE_768_CONFIRM, arms.stages_of(arms.SCALE_768_CONFIRM), Path("/r"))
    pretrain = group.stage("pretrain").argv
    for flag, value in (("--dim", "768"), ("--n-layers", "12"), ("--steps", "2500"), ("--theta", "0.75")):
        assert pretrain[pretrain.index(flag) + 1] == value
    passkey = group.stage("passkey-hybrid-tapa-theta75").argv
    assert passkey[passkey.index("--tasks") + 1] == "all"
    names = [stage.name for stage in group.stages]
    assert "domain0" in names and "domain1-hybrid-tapa-theta75" in names
    assert arms.SCALE_768_CONFIRM.fingerprint() != arms.SCALE_768.fingerprint()
    assert plan.check_flags([group]) == []


def test_screen_arms_build_the_layouts_their_names_promise():
    """Over the toy recipe's 8 layers: the base hybrids 2 global layers, the LLG-ratio arms 3, the
    LLLLLG-ratio arms 1; over the confirmation's 12 layers 3, 4 and 2; every hybrid arm's last
    layer global. A short pattern repeats from layer 0, so "LLG" written as is would give LLGLLGLL
    over 8 layers (the last two local): the ratio levers are written out per protocol. The job
    label names the pattern."""
    import argparse

    from tapa.train import command as train_command

    parser = argparse.ArgumentParser()
    train_command.add_arguments(parser)
    for protocol, expected in ((arms.TOY_GPU_SCREEN, {"llg": 3, "l5g": 1, "": 2}),
                               (arms.SCALE_768_CONFIRM, {"llg": 4, "l5g": 2, "": 3})):
        for kind in ("tapa", "nope"):
            for name in [f"hybrid-{kind}"] + [a for a in arms.ARMS if a.startswith(f"hybrid-{kind}-")]:
                flags = [*protocol.model, *plan._fill(arms.ARMS[name].pretrain, protocol)]
                _, model, _ = train_command.configs_from_args(parser.parse_args(["--recipe", protocol.recipe, *flags]))
                kinds = [model.layer_kind(i) for i in range(model.n_layers)]
                assert model.n_layers == protocol.n_layers and kinds[-1] == "global", (name, kinds)
                last = name.rsplit("-", 1)[-1]  # by the name's last lever: theta75-llg is an LLG arm
                globals_ = expected.get(last, expected[""])
                assert kinds.count("global") == globals_, (protocol.name, name, kinds)
                assert model.theta == (0.75 if "theta75" in name else 0.25 if "theta25" in name else 0.5), name
                if last in ("llg", "l5g"):
                    assert f"{globals_} of {protocol.n_layers} layers global" in plan.arm_label(arms.ARMS[name], protocol)


def test_ratio_patterns_end_in_a_global_layer_and_the_runner_refuses_one_that_does_not():
    assert [arms.ratio_pattern(n, 3) for n in (3, 4, 8, 12)] == ["LLG", "LLLG", "LGLLGLLG", "LLGLLGLLGLLG"]
    assert [arms.ratio_pattern(n, 6) for n in (4, 8, 12)] == ["LLLG", "LLLLLLLG", "LLLLLGLLLLLG"]
    assert arms.ratio_pattern(8, 4) == "LLLGLLLG"  # the base hybrid's own layout
    with pytest.raises(ValueError, match="positive"):
        arms.ratio_pattern(0, 3)
    jobs = run.configure(run.parse_args(["--protocol", "scale-768-confirm", "--jobs", "hybrid-tapa-llg:0.001:0"]))[2]
    fine = plan.build_groups(jobs, arms.SCALE_768_CONFIRM, list(arms.STAGES), Path("/tmp/none"))
    assert plan.check_flags(fine) == []
    # the 8-layer pattern written as is over 12 layers: LGLLGLLG LGLL, the last layer local
    short = plan.build_groups(jobs, arms.SCALE_768_CONFIRM, list(arms.STAGES), Path("/tmp/none"),
                              train_extra=["--layer-pattern", "LGLLGLLG"])
    with pytest.warns(UserWarning, match="repeats from layer 0"):  # tapa's own warning, then ours
        problems = plan.check_flags(short)
    assert len(problems) == 1 and "pretrain" in problems[0]
    assert "leaves the last layer local (LGLLGLLGLGLL)" in problems[0]


def test_the_eval_only_temperature_arms_read_the_base_runs_with_the_flag():
    """hybrid-KIND-evaltemp shares its base arm's pretraining and continual runs; every evaluation
    of those runs then adds --eval-query-temperature at the pretraining length, and the job's
    summary picks the method that flag added. A group without such an arm has no flag."""
    from lab.study import summarize

    for kind in ("tapa", "nope"):
        arm = arms.ARMS[f"hybrid-{kind}-evaltemp"]
        assert arm.eval_temperature and plan.pretrain_owner(arm) == plan.continual_owner(arm) == f"hybrid-{kind}"
    jobs = run.configure(run.parse_args(["--protocol", "toy-gpu-screen", "--jobs",
                                         "hybrid-nope:0.001:0,hybrid-nope-evaltemp:0.001:0,hybrid-tapa:0.001:0"]))[2]
    groups = plan.build_groups(jobs, arms.TOY_GPU_SCREEN, list(arms.STAGES), Path("/tmp/none"))
    assert plan.check_flags(groups) == []
    by_arm = {job.arm: group for group in groups for job in group.jobs}
    assert by_arm["hybrid-nope"] is by_arm["hybrid-nope-evaltemp"]
    for group, tempered in ((by_arm["hybrid-nope"], True), (by_arm["hybrid-tapa"], False)):
        evaluations = [stage for stage in group.stages if stage.argv[0] == "eval"]
        assert {stage.kind for stage in evaluations} == {"eval0", "domain0", "eval1", "domain1", "passkey"}
        for stage in evaluations:
            assert ("--eval-query-temperature" in stage.argv) == tempered, stage.argv
            assert stage.methods == 1 + tempered
            if tempered:
                assert stage.argv[stage.argv.index("--eval-query-temperature") + 1] == "512"
    methods = [{"label": "NoPE hybrid (LLLG, w256)", "pe": "nope", "trained_pe": "nope", "variant": None,
                "query_temperature": None},
               {"label": "NoPE hybrid (LLLG, w256) + query temperature 512", "pe": "nope", "trained_pe": "nope",
                "variant": "query temperature 512", "query_temperature": {"base": 512, "scale": 0.1}}]
    results = {"methods": methods, "runs": ["r"]}
    assert summarize._pick_method(results, None) is methods[0]
    assert summarize._pick_method(results, None, temperature=True) is methods[1]
    # a model trained with the temperature, read as trained: its own method
    trained = [{**methods[1], "label": "NoPE hybrid (LLLG, w256)", "variant": None}]
    assert summarize._pick_method({"methods": trained, "runs": ["r"]}, None) is trained[0]
    with pytest.raises(ValueError, match="with the query temperature"):
        summarize._pick_method({"methods": methods[:1], "runs": ["r"]}, None, temperature=True)


def test_an_evaltemp_stage_keeps_the_same_model_read_without_the_temperature(tmp_path):
    """The job JSON of an eval-time temperature arm holds both readings of its one model, so the
    lever is read within a run (a separate run of the base arm differs where training is not
    repeatable); the base arm's own stages hold one reading."""
    from lab.study import summarize

    def method(label, variant, ppl, hits):
        return {"label": label, "pe": "nope", "trained_pe": "nope", "variant": variant, "train_len": 512,
                "perplexity": [{"length": n, "perplexity": p, "loss": 1.0, "tokens": 10, "windows": 1,
                                "rope_scale": 1.0, "seconds": 0.1, "buckets": [n]} for n, p in ((1024, ppl), (512, 8.0))],
                "passkey": {"correct": [[hits]]}, "tasks": {"single-key": {"correct": [[hits]]}}}

    results = {"methods": [method("NoPE", None, 9.0, 3), method("NoPE + t", "query temperature 512", 7.5, 5)],
               "runs": ["r"], "split": "test", "stride": 256, "max_tokens": 100, "hardware": "cpu", "date": "d"}
    (tmp_path / "results.json").write_text(json.dumps(results))
    stage = summarize._evaluation_summary(tmp_path, None, passkey=False, temperature=True)
    assert [r["perplexity"] for r in stage["perplexity"]] == [8.0, 7.5]
    assert stage["without_temperature"]["label"] == "NoPE"
    assert [r["perplexity"] for r in stage["without_temperature"]["perplexity"]] == [8.0, 9.0]
    assert stage["without_temperature"]["position_loss_longest"] == [1024]
    retrieval = summarize._evaluation_summary(tmp_path, None, passkey=True, temperature=True)
    assert retrieval["passkey"]["correct"] == [[5]] and retrieval["tasks"]["single-key"]["correct"] == [[5]]
    assert retrieval["without_temperature"]["passkey"]["correct"] == [[3]]
    assert retrieval["without_temperature"]["tasks"]["single-key"]["correct"] == [[3]]
    assert "without_temperature" not in summarize._evaluation_summary(tmp_path, None, passkey=False)


def test_a_tapa_only_lever_with_a_ratio_pairs_with_nope_at_that_ratio():
    """theta is TAPA's own, so theta75-llg is read against NoPE globals at the LLG ratio (not the
    NoPE base), and theta75 alone against the NoPE base."""
    names = ["hybrid-tapa-theta75-llg", "hybrid-tapa-theta75", "hybrid-nope", "hybrid-nope-llg"]
    assert screen.kind_pairs(names) == [("hybrid-tapa-theta75-llg", "hybrid-nope-llg"),
                                        ("hybrid-tapa-theta75", "hybrid-nope")]


def test_runner_refuses_domain_stages_without_a_domain():
    with pytest.raises(SystemExit, match="no second domain"):
        run.configure(run.parse_args(["--protocol", "tiny-cpu", "--jobs", "nope:0.001:0",
                                      "--stages", "domain1"]))


def screen_job(arm, seed, continual, domain_ppl, tasks, protocol="toy-gpu-screen", lacking=()):
    """A job JSON with continual perplexity at 4096 and 16384 on both texts, and a retrieval grid
    of two lengths x two depths at 10 trials a cell (tasks: {task: [[hits]]}; the task "passkey"
    is the trained passkey grid, the others the suite's; `lacking`: the stages a partial job did not
    reach)."""
    proto = arms.PROTOCOLS[protocol].to_dict()
    ppl = lambda values: {"perplexity": [{"length": n, "perplexity": v, "tokens": 100}
                                         for n, v in zip((4096, 16384), values)]}
    grids = {task: {"lengths": [8192, 16384], "depths": [0.0, 1.0], "trials": 10,
                    "correct": hits, "accuracy": [[h / 10 for h in row] for row in hits]}
             for task, hits in tasks.items()}
    passkey = grids.pop("passkey", {})
    return {"kind": "tapa-study-job", "job": f"{arm}:0.001:{seed}", "arm": arm, "label": arm,
            "seed": seed, "lr": 0.001, "protocol": proto, "stages_done": ["pretrain"],
            "stages_requested": ["pretrain", *lacking], "complete": not lacking,
            "date": "2026-12-05T00:00:00", "hardware": ["H200"],
            "corpus": {"domain": {"domain": "package-docs", "files": 3, "bytes": 1000,
                                  "sha256": "ab" * 32}},
            "results": {"eval1": ppl(continual),
                        "domain1": {**ppl(domain_ppl), "data": {"source": "/x/package-docs"}},
                        "passkey": {"passkey": passkey, "tasks": grids}}}


def write_jobs(folder, jobs):
    for index, job in enumerate(jobs):
        (folder / f"{index}.job.json").write_text(json.dumps(job))


def screen_text(tmp_path, jobs) -> str:
    """screen.md of the screen run on `jobs`, written to tmp_path."""
    write_jobs(tmp_path, jobs)
    screen.screen([tmp_path], tmp_path / "out", "cmd")
    return (tmp_path / "out" / "screen.md").read_text()


def test_screen_tables_compare_each_lever_with_its_base(tmp_path):
    full, half = [[10, 10], [10, 10]], [[5, 5], [5, 5]]
    jobs = [screen_job("hybrid-tapa", 0, [10.0, 20.0], [30.0, 40.0], {"single-key": half, "multi-key": half}),
            screen_job("hybrid-tapa-w64", 0, [10.0, 18.0], [30.0, 44.0], {"single-key": full, "multi-key": [[0, 0], [5, 5]]}),
            screen_job("hybrid-tapa", 0, [10.0, 25.0], [30.0, 40.0], {"single-key": half}, protocol="toy-gpu-c4096"),
            screen_job("retrofit-tapa", 0, [10.0, 30.0], [30.0, 40.0], {"single-key": half}, protocol="toy-gpu-cl20"),
            screen_job("hybrid-nope", 0, [11.0, 30.0], [31.0, 50.0], {"single-key": full, "multi-key": full})]
    folder = tmp_path / "in"
    folder.mkdir()
    write_jobs(folder, jobs)
    written = screen.screen([folder], tmp_path / "out", "cmd")
    assert {p.name for p in written} == set(screen.OUTPUTS)
    text = (tmp_path / "out" / "screen.md").read_text()
    levers = next(part for part in text.split("\n\n") if part.startswith("| arm | base |"))
    rows = {line.split(" | ")[0].strip("| "): line for line in levers.splitlines()[2:]}
    # w64 against hybrid-tapa: test 16k 18/20 - 1 = -10%, domain 16k 44/40 - 1 = +10%,
    # single-key 100 - 50 = +50 points at both lengths, multi-key 0 - 50 and 50 - 50
    lever = rows["hybrid-tapa-w64"]
    assert "| hybrid-tapa | 0 | +0.0% | -10.0% | +0.0% | +10.0% | +50 | +50 | -50 | +0 |" in lever
    assert "+25.0%" in rows["hybrid-tapa@c4096"]  # the continual stage at 4096, against the base
    assert "+50.0%" in rows["retrofit-tapa@cl20"]  # a retrofit with the 20% stage, against its kind's base
    assert set(rows) == {"hybrid-tapa-w64", "hybrid-tapa@c4096", "retrofit-tapa@cl20"}  # a base has no lever row
    with open(tmp_path / "out" / "perplexity.csv", newline="") as handle:
        labels = {r["arm"]: r["label"] for r in csv.DictReader(handle)}
    assert labels["retrofit-tapa@cl20"] == "retrofit-tapa, continual stage 20%"
    assert labels["hybrid-tapa@c4096"] == "hybrid-tapa, continual at 4096"
    assert "second domain package-docs: 3 files" in text
    with open(tmp_path / "out" / "retrieval.csv", newline="") as handle:
        found = {(r["arm"], r["task"], r["length"]): r for r in csv.DictReader(handle)}
    cell = found[("hybrid-tapa-w64", "multi-key", "16384")]
    assert (cell["correct"], cell["trials"], float(cell["accuracy"])) == ("10", "20", 0.5)
    assert 0.27 < float(cell["low"]) < 0.5 < float(cell["high"]) < 0.73  # Wilson, n = 20
    with open(tmp_path / "out" / "perplexity.csv", newline="") as handle:
        sources = {r["source"] for r in csv.DictReader(handle) if r["data"] == "domain"}
    assert sources == {"package-docs"}


def test_screen_sets_tapa_against_nope_under_the_same_lever(tmp_path):
    full, half, none = [[10, 10], [10, 10]], [[5, 5], [5, 5]], [[0, 0], [0, 0]]
    jobs = [screen_job("hybrid-tapa", 0, [10.0, 20.0], [30.0, 40.0], {"passkey": half, "single-key": none}),
            screen_job("hybrid-tapa-theta75", 0, [10.0, 18.0], [30.0, 40.0], {"passkey": full, "single-key": half}),
            screen_job("hybrid-tapa-w64", 0, [10.0, 22.0], [30.0, 40.0], {"passkey": none, "single-key": none}),
            screen_job("hybrid-nope", 0, [10.0, 20.0], [30.0, 50.0], {"passkey": half, "single-key": half}),
            screen_job("hybrid-nope-w64", 0, [10.0, 11.0], [30.0, 40.0], {"passkey": full, "single-key": full})]
    text = screen_text(tmp_path, jobs)
    table = next(part for part in text.split("\n\n") if part.startswith("| arm | NoPE arm |"))
    assert "| passkey 8k | passkey 16k | single-key 8k | single-key 16k |" in table
    rows = {line.split(" | ")[0].strip("| "): line for line in table.splitlines()[2:]}
    assert set(rows) == {"hybrid-tapa", "hybrid-tapa-theta75", "hybrid-tapa-w64"}
    # theta has no NoPE arm: against the NoPE base (test 16k 18/20, domain 16k 40/50, passkey
    # 100 - 50, single-key 50 - 50); w64 against NoPE's w64 (22/11, passkey 0 - 100)
    assert "| hybrid-tapa-theta75 | hybrid-nope | 0 | +0.0% | -10.0% | +0.0% | -20.0% | +50 | +50 | +0 | +0 |" in table
    assert "| hybrid-tapa-w64 | hybrid-nope-w64 | 0 | +0.0% | +100.0% | +0.0% | +0.0% | -100 | -100 | -100 | -100 |" in table
    with open(tmp_path / "out" / "retrieval.csv", newline="") as handle:
        tasks = {r["task"] for r in csv.DictReader(handle)}
    assert tasks == {"passkey", "single-key"}


def test_screen_tests_tapa_against_nope_seed_by_seed(tmp_path):
    """With 3 seeds a side, the seed table lists every seed and the one-sided p-values: TAPA lower
    in perplexity on every seed gives the exact Mann-Whitney floor 1/20; TAPA behind in retrieval
    gives p near 1. A scale step (@768) is compared within itself, never with the toy arms, and an
    arm with one seed gets no seed rows."""
    hits = lambda h: [[h, h], [h, h]]
    jobs = []
    for seed in range(3):
        jobs += [screen_job("hybrid-tapa-theta75", seed, [10.0, 18.0 + seed], [30.0, 40.0], {"single-key": hits(2)}),
                 screen_job("hybrid-nope", seed, [10.0, 21.0 + seed], [30.0, 40.0], {"single-key": hits(6 + seed)}),
                 screen_job("hybrid-tapa-theta75", seed, [9.0, 15.0], [30.0, 40.0], {"single-key": hits(9)},
                            protocol="scale-768-confirm")]
    jobs += [screen_job("hybrid-nope", 0, [9.0, 16.0], [30.0, 40.0], {"single-key": hits(1)}, protocol="scale-768-confirm"),
             screen_job("hybrid-tapa-w64", 0, [10.0, 18.0], [30.0, 40.0], {"single-key": hits(2)}),
             screen_job("hybrid-tapa-theta75-pk10", 1, [10.0, 18.0], [30.0, 40.0], {"single-key": hits(2)}),
             screen_job("hybrid-nope-pk10", 1, [10.0, 18.0], [30.0, 40.0], {"single-key": hits(2)})]
    write_jobs(tmp_path, jobs)
    written = screen.screen([tmp_path], tmp_path / "out", "cmd")
    assert (tmp_path / "out" / "seeds.png") in written  # the arms with 2+ seeds, seed by seed
    text = (tmp_path / "out" / "screen.md").read_text()
    assert "![seeds](seeds.png)" in text
    table = next(part for part in text.split("\n\n") if part.startswith("| arm | NoPE arm | measure |"))
    rows = {tuple(cell.strip() for cell in line.strip("|").split("|")[:3]): line for line in table.splitlines()[2:]}
    assert {arm for arm, _, _ in rows} == {"hybrid-tapa-theta75"}  # 768 has one NoPE seed; w64 one seed
    line = rows[("hybrid-tapa-theta75", "hybrid-nope", "test ppl 16k")]
    assert "| 18.00 / 19.00 / 20.00 | 21.00 / 22.00 / 23.00 | -3.00 |" in line
    assert line.rstrip(" |").endswith("0.050")
    assert float(line.split("|")[-3]) < 0.05  # Welch: a clear gap, no spread difference
    keys = rows[("hybrid-tapa-theta75", "hybrid-nope", "single-key 16k")]
    assert "| 20 / 20 / 20 | 60 / 70 / 80 |" in keys and keys.rstrip(" |").endswith("1.000")
    kinds = next(part for part in text.split("\n\n") if part.startswith("| arm | NoPE arm | seeds | test"))
    assert "| hybrid-tapa-theta75@768 | hybrid-nope@768 |" in kinds  # within the scale step
    # a one-seed arm against the same seed of its reference, not the reference's mean: w64's 18
    # against NoPE's seed-0 21 (the mean of its 3 seeds is 22); theta's own lever is left out of
    # the match, so theta 0.75 with the 10% passkey share meets NoPE with the 10% share
    assert "| hybrid-tapa-w64 | hybrid-nope | 0 | +0.0% | -14.3% |" in kinds
    assert "| hybrid-tapa-theta75-pk10 | hybrid-nope-pk10 | 1 | +0.0% | +0.0% |" in kinds
    assert screen.base_of("hybrid-nope@768") is None and screen.base_of("hybrid-tapa@768") is None
    assert screen.base_of("hybrid-tapa-theta75@768") == "hybrid-tapa@768"
    assert screen.base_of("hybrid-tapa@c4096") == "hybrid-tapa"  # a protocol lever: against the base
    # --seeds: one seed's tables (no seed table then), and a clear error for a seed never run
    screen.screen([tmp_path], tmp_path / "seed0", "cmd", seeds=[0])
    with open(tmp_path / "seed0" / "perplexity.csv", newline="") as handle:
        assert {r["seed"] for r in csv.DictReader(handle)} == {"0"}
    assert "| arm | NoPE arm | measure |" not in (tmp_path / "seed0" / "screen.md").read_text()
    with pytest.raises(ValueError, match="no job of the seeds"):
        screen.screen([tmp_path], tmp_path / "seed7", "cmd", seeds=[7])


def test_screen_scores_retrieval_beyond_the_local_window(tmp_path):
    """A needle next to the question (depth 1.0) is copied by the local layers; the deciding
    measures count only the depths whose needle lies beyond the largest local window among the
    arms, the same cells for every arm (a window-free RoPE arm included)."""
    local_only, global_too = [[0, 0, 10], [0, 0, 10]], [[6, 6, 10], [3, 3, 10]]
    jobs = [screen_job("hybrid-tapa", 0, [10.0, 20.0], [30.0, 40.0], {"single-key": local_only}),
            screen_job("hybrid-nope", 0, [10.0, 20.0], [30.0, 40.0], {"single-key": global_too}),
            screen_job("rope-yarn", 0, [10.0, 20.0], [30.0, 40.0], {"single-key": global_too})]
    for job, pattern, window in zip(jobs, ("LLLG", "LLLG", "G"), (256, 256, 0)):
        for task in job["results"]["passkey"]["tasks"].values():
            task["depths"], task["lengths"] = [0.0, 0.75, 1.0], [2048, 16384]
        job["results"]["pretrain"] = {"model": {"layer_pattern": pattern, "local_window": window}}
    assert [screen.local_window(j) for j in jobs] == [256, 256, 0]
    rows, cells = screen.retrieval_rows(jobs)
    found = {(r["arm"], r["length"]): r for r in rows}
    tapa = found[("hybrid-tapa", 2048)]
    assert (tapa["correct"], tapa["trials"], tapa["far_correct"], tapa["far_trials"]) == (10, 30, 0, 20)
    assert found[("rope-yarn", 16384)]["far_accuracy"] == 0.3 and found[("rope-yarn", 16384)]["beyond"] == 256
    assert [c["beyond_window"] for c in cells[:3]] == [True, True, False]
    text = screen_text(tmp_path, jobs)
    # TAPA's 33% over every depth is 0% beyond the window, NoPE's 60% against 73% over every depth
    assert "| hybrid-tapa | hybrid-nope | 0 | +0.0% | +0.0% | +0.0% | +0.0% | -60 | -30 |" in text
    assert "| hybrid-tapa | 0 (0-16); all 33 | 0 (0-16); all 33 |" in text
    assert "more than 256 tokens back" in text


def test_screen_checks_the_issues_goal_criterion_by_criterion(tmp_path):
    """The goal row: met only when TAPA is better beyond the seed spread in far perplexity AND in
    multi-key retrieval AND within 1% of RoPE + YaRN; one failing criterion fails the goal, and a
    missing RoPE + YaRN arm is not read as met. The single-key line reads 8x the pretraining
    length."""
    hits = lambda h: [[h, h], [h, h]]

    def write(folder, tapa_far, nope_keys, rope_far):
        folder.mkdir()
        jobs = []
        for seed in range(3):
            jobs += [screen_job("hybrid-tapa-theta75", seed, [10.0, tapa_far + seed], [30.0, 40.0],
                                {"multi-key": hits(9), "single-key": hits(9)}),
                     screen_job("hybrid-nope", seed, [10.5, 21.0 + seed], [30.0, 40.0],
                                {"multi-key": hits(nope_keys + seed), "single-key": hits(5)})]
            if rope_far is not None:
                jobs.append(screen_job("rope-yarn", seed, [10.0, rope_far + seed], [30.0, 40.0], {}))
        for index, job in enumerate(jobs):
            job["protocol"]["pretrain_len"] = 1024  # so 8x is the grid's 8192
            (folder / f"{index}.job.json").write_text(json.dumps(job))
        screen.screen([folder], folder / "out", "cmd")
        text = (folder / "out" / "screen.md").read_text()
        table = next(part for part in text.split("\n\n") if part.startswith("| arm | NoPE arm | seeds | perplexity, far"))
        return table.splitlines()[2], text

    row, text = write(tmp_path / "met", 18.0, 2, 17.9)
    assert row.startswith("| hybrid-tapa-theta75 | hybrid-nope | 3 / 3 | met (p 0.050) | met (p 0.050) | met (x1.005, seeds 0, 1, 2) |")
    assert row.endswith("| met |")
    assert "Single-key retrieval at 8x the pretraining length (8k): the best arm, hybrid-tapa-theta75, 90%" in text
    assert "(goal 90%: met)" in text
    row, _ = write(tmp_path / "far-from-rope", 18.0, 2, 17.0)  # 19/18 on the means: 5.6% above RoPE + YaRN
    assert "| not met (x1.056, seeds 0, 1, 2) | not met |" in row
    row, _ = write(tmp_path / "no-rope", 18.0, 2, None)
    assert "| no rope-yarn arm with shared seeds | not met |" in row
    row, _ = write(tmp_path / "keys-level", 18.0, 8, 17.9)  # NoPE's multi-key 80-100% against 90%
    assert "| met (p 0.050) | not met (p " in row and row.endswith("| not met |")


def test_the_goal_is_read_against_every_nope_arm_with_three_seeds(tmp_path):
    """The goal is to beat the best NoPE configuration: a TAPA arm is tested against NoPE under its
    own lever and against every other NoPE arm of its scale with 3+ seeds, and meets the goal only
    against all of them. Here TAPA's LLG beats the NoPE base but not NoPE's LLG; a NoPE arm with
    2 seeds and a scale-768 arm are not in the goal table."""
    hits = lambda h: [[h, h], [h, h]]
    jobs = []
    for seed in range(3):
        jobs += [screen_job("hybrid-tapa-llg", seed, [10.0, 18.0 + seed], [30.0, 40.0], {"multi-key": hits(9)}),
                 screen_job("hybrid-nope", seed, [10.5, 21.0 + seed], [30.0, 40.0], {"multi-key": hits(2 + seed)}),
                 screen_job("hybrid-nope-llg", seed, [10.0, 15.0 + seed], [30.0, 40.0], {"multi-key": hits(10)}),
                 screen_job("rope-yarn", seed, [10.0, 17.9 + seed], [30.0, 40.0], {}),
                 screen_job("hybrid-nope", seed, [9.0, 12.0], [30.0, 40.0], {"multi-key": hits(10)},
                            protocol="scale-768-confirm")]
    jobs += [screen_job("hybrid-nope-w64", seed, [10.0, 12.0], [30.0, 40.0], {"multi-key": hits(10)})
             for seed in range(2)]
    text = screen_text(tmp_path, jobs)
    table = next(part for part in text.split("\n\n") if part.startswith("| arm | NoPE arm | seeds | perplexity, far"))
    rows = [line.split(" | ")[:2] for line in table.splitlines()[2:]]
    assert rows == [["| hybrid-tapa-llg", "hybrid-nope-llg"], ["| hybrid-tapa-llg", "hybrid-nope"]]
    assert table.splitlines()[2].endswith("| not met |") and table.splitlines()[3].endswith("| met |")
    assert "hybrid-tapa-llg does not meet the goal (1 of 2 NoPE arms)" in text
    seeds = next(part for part in text.split("\n\n") if part.startswith("| arm | NoPE arm | measure |"))
    assert "| hybrid-tapa-llg | hybrid-nope | test ppl 16k | 18.00 / 19.00 / 20.00 | 21.00 / 22.00 / 23.00 |" in seeds


def test_screen_refuses_inputs_without_screen_jobs(tmp_path):
    job = screen_job("hybrid-tapa", 0, [1.0, 1.0], [1.0, 1.0], {})
    job["protocol"]["name"] = "toy-gpu"
    (tmp_path / "a.job.json").write_text(json.dumps(job))
    with pytest.raises(ValueError, match="no jobs of the screen protocols"):
        screen.screen_jobs([tmp_path])


@pytest.mark.slow  # trains and evaluates three tiny groups on CPU (~2 min)
def test_tiny_screen_end_to_end(tmp_path, capsys):
    out = tmp_path / "out"
    rc = run.main(["--protocol", "tiny-cpu-screen", "--jobs",
                   "hybrid-tapa:0.001:0,hybrid-nope:0.001:0,hybrid-nope-evaltemp:0.001:0,retrofit-tapa:0.001:0",
                   "--root", str(tmp_path), "--out", str(out), "--time-budget", "600"])
    printed = capsys.readouterr().out
    assert rc == 0, printed
    (archive,) = out.glob("study-*.tar.gz")
    with tarfile.open(archive) as tar:
        jobs = [json.load(tar.extractfile(m)) for m in tar.getmembers() if m.name.endswith(".job.json")]
    for job in jobs:
        assert job["complete"], job["stages_done"]
        assert job["results"]["domain1"]["data"]["source"].endswith("domain/package-docs")
        assert job["corpus"]["domain"]["files"] > 0
        assert set(job["results"]["passkey"]["tasks"]) == {"single-key", "multi-key"}
    assert {j["arm"] for j in jobs} == {"hybrid-tapa", "hybrid-nope", "hybrid-nope-evaltemp", "retrofit-tapa"}
    # the temperature at evaluation only: the NoPE arm's own runs, read with it
    plain, tempered = (next(j for j in jobs if j["arm"] == arm) for arm in ("hybrid-nope", "hybrid-nope-evaltemp"))
    assert tempered["eval_temperature"] and not plain["eval_temperature"]
    for stage in ("eval0", "eval1", "domain1", "passkey"):
        assert tempered["results"][stage]["label"].endswith("+ query temperature 32"), stage
        assert "query temperature" not in plain["results"][stage]["label"]
    assert tempered["results"]["eval1"]["perplexity"][-1] != plain["results"]["eval1"]["perplexity"][-1]
    # the same run read without the temperature is the base arm's reading (one call: shared runs)
    def read(rows):
        return [(r["length"], r["perplexity"]) for r in rows]
    for stage in ("eval0", "eval1", "domain1"):
        assert read(tempered["results"][stage]["without_temperature"]["perplexity"]) == read(
            plain["results"][stage]["perplexity"]), stage
    assert tempered["results"]["passkey"]["without_temperature"]["passkey"] == plain["results"]["passkey"]["passkey"]
    written = screen.screen([out], tmp_path / "agg", "cmd")
    assert {p.name for p in written} == set(screen.OUTPUTS)
    text = (tmp_path / "agg" / "screen.md").read_text()
    assert "| retrofit-tapa | hybrid-tapa |" in text
    # the eval-time lever against the same run read without it; in one call that run is the base's
    assert "| hybrid-nope-evaltemp | hybrid-nope-evaltemp-plain |" in text
    twin = next(line for line in text.splitlines() if line.startswith("| hybrid-nope-evaltemp-plain | hybrid-nope |"))
    assert all(cell.strip() in ("+0.0%", "+0") for cell in twin.strip("|").split("|")[3:]), twin
    # the theory stage's logit moments of each pretraining's global layer, under the arm that owns
    # the pretraining run (the retrofit and the eval-only temperature have none of their own)
    theory = next(part for part in text.split("\n\n") if part.startswith("| arm | seed | layer |"))
    assert {line.split(" | ")[0].strip("| ") for line in theory.splitlines()[2:]} == {
        j["label"] for j in jobs if j["arm"] not in ("retrofit-tapa", "hybrid-nope-evaltemp")}


def test_retrieval_defaults_keep_older_jobs_ids():
    """Jobs recorded before the retrieval fields existed keep their protocol id; a job JSON's
    lists hash like the protocol's tuples; the screen's suite changes the id."""
    from lab.study.aggregate import protocol_fingerprint

    new = arms.TOY_GPU.to_dict()
    old = {k: v for k, v in new.items() if k not in ("retrieval_tasks", "task_trials", "domain")}
    as_json = json.loads(json.dumps(new))
    assert protocol_fingerprint(old) == protocol_fingerprint(new) == protocol_fingerprint(as_json)
    assert arms.TOY_GPU_SCREEN.fingerprint() != arms.TOY_GPU.fingerprint()
    # the screen shares the toy protocol's pretraining
    assert protocol_fingerprint(arms.TOY_GPU_SCREEN.to_dict(), "pretrain") == \
        protocol_fingerprint(old, "pretrain")


def test_keep_jobs_copies_an_archives_job_jsons_once(tmp_path):
    job = screen_job("hybrid-tapa", 0, [10.0, 20.0], [30.0, 40.0], {"single-key": [[5, 5], [5, 5]]})
    archive = tmp_path / "study-toy-gpu-screen-20261205-120028-1106.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for name, text in (("jobs/hybrid-tapa-lr0.001-s0.job.json", json.dumps(job)),
                           ("logs/runner.log", "a log"), ("corpus/tokenizer.json", "{}")):
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    (kept,) = screen.keep_jobs([archive], tmp_path / "jobs")
    assert kept.name == "jobs-20261205-120028-1106.tar.gz"
    with tarfile.open(kept) as tar:
        assert tar.getnames() == ["jobs/hybrid-tapa-lr0.001-s0.job.json"]
    first, mtime = kept.read_bytes(), kept.stat().st_mtime_ns
    os.utime(kept, ns=(mtime - 10**9, mtime - 10**9))
    screen.keep_jobs([archive], tmp_path / "jobs")
    assert kept.read_bytes() == first and kept.stat().st_mtime_ns == mtime - 10**9  # not rewritten
    assert screen.screen_jobs([tmp_path / "jobs"])[0]["arm"] == "hybrid-tapa"
    with pytest.raises(ValueError, match="not a runner archive"):
        screen.keep_jobs([tmp_path / "other.tar.gz"], tmp_path / "jobs")


def test_far_passkey_pools_the_depths_beyond_the_window(tmp_path, capsys):
    """From an aggregated passkey.csv: at 2048 with a 256-token window the depths 0-0.75 are beyond
    it and 1.0 is not; hybrid and RoPE + YaRN arms only."""
    from lab.study import far_passkey
    path = tmp_path / "passkey.csv"
    rows = ["arm,label,lr,seeds,trials,length,depth,mean,std"]
    for depth, mean, std in ((0.0, 0.2, 0.3), (0.25, 0.4, 0.1), (0.5, 0.0, 0.0), (0.75, 0.2, ""), (1.0, 0.9, 0.05)):
        rows.append(f"hybrid-tapa-cl0.1,TAPA hybrid,0.001,3,50,2048,{depth},{mean},{std}")
        rows.append(f"tapa-cl0.1,TAPA,0.002,3,50,2048,{depth},{mean},{std}")
    path.write_text("\n".join(rows) + "\n")
    (row,) = far_passkey.far_rows(path)
    assert row["arm"] == "hybrid-tapa-cl0.1" and row["seeds"] == 3
    assert row["far"] == pytest.approx(20.0) and row["all"] == pytest.approx(34.0) and row["last"] == pytest.approx(90.0)
    assert row["far_std_max"] == pytest.approx(30.0)
    assert far_passkey.main([str(path)]) == 0
    assert "| TAPA hybrid | 3 | 20 (±30) / 34 / 90 |" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="far_passkey"):
        far_passkey.main([str(tmp_path / "missing.csv")])


def test_plots_give_twins_one_colour_and_each_lever_its_own():
    assert screen.lever_of("hybrid-tapa-w128") == screen.lever_of("hybrid-nope-w128") == "hybrid-*-w128"
    assert screen.lever_of("hybrid-nope@768") == screen.lever_of("hybrid-tapa@768") == "hybrid-*@768"
    assert screen.lever_of("hybrid-tapa-theta75") == "hybrid-*-theta75"
    assert screen.lever_of("rope-yarn") == "rope-yarn"
    assert screen.lever_of("retrofit-tapa-clr03") == screen.lever_of("retrofit-nope-clr03") == "retrofit-*-clr03"
    arms_run = ["hybrid-tapa", "hybrid-tapa-w128", "hybrid-tapa-theta75", "hybrid-nope", "hybrid-nope-w128",
                "rope-yarn"]
    plt, fig, _, _, style = screen._line_panels([{"arm": arm, "seed": 0} for arm in arms_run], 4)
    plt.close(fig)
    styles = {arm: style(arm) for arm in arms_run}
    assert styles["hybrid-tapa-w128"]["color"] == styles["hybrid-nope-w128"]["color"]
    assert styles["hybrid-tapa"]["color"] == styles["hybrid-nope"]["color"]
    assert (styles["hybrid-tapa-w128"]["linestyle"], styles["hybrid-nope-w128"]["linestyle"]) == ("-", "--")
    levers = [styles[arm]["color"] for arm in ("hybrid-tapa", "hybrid-tapa-w128", "hybrid-tapa-theta75", "rope-yarn")]
    assert len(set(levers)) == 4
    # the whole screen's levers (more than the default cycle's colours) still get one colour each
    every = [arm for _, arm in arms.screen_plan()] + ["rope-yarn"]
    colours = screen._lever_colours(plt, every)
    assert len({screen.lever_of(arm) for arm in every}) > 13
    assert len({str(colours[arm]) for arm in every}) == len({screen.lever_of(arm) for arm in every})


def test_screen_reports_its_progress_and_the_next_call(tmp_path):
    plan = arms.screen_plan()
    assert plan[:4] == [("toy-gpu-screen", "hybrid-tapa"), ("toy-gpu-screen", "hybrid-nope"),
                        ("toy-gpu-screen", "hybrid-tapa-w64"), ("toy-gpu-screen", "hybrid-nope-w64")]
    assert ("toy-gpu-c4096", "hybrid-nope") in plan and ("toy-gpu-screen", "hybrid-tapa-theta75-llg") in plan
    assert all(arm in arms.ARMS for _, arm in plan) and len(set(plan)) == len(plan)
    # the queue: every planned arm's seed 0, the follow-up seeds of planned arms, no job twice
    queue = arms.screen_queue()
    assert len(set(queue)) == len(queue) and {(p, a) for p, a, _ in queue} == set(plan)
    assert {(p, a) for p, a, s in queue if s == 0} == set(plan)
    assert queue[:2] == [("toy-gpu-screen", "hybrid-tapa-temp", 1), ("toy-gpu-screen", "hybrid-nope-temp", 1)]
    assert queue[4:7] == [("toy-gpu-screen", "hybrid-nope-temp-llg", 0), ("toy-gpu-screen", "hybrid-tapa-temp-llg", 1),
                          ("toy-gpu-screen", "hybrid-nope-temp-llg", 1)]
    # the later seeds: both levers of NoPE's best multi-key (temperature, window 128) last; window
    # 128 alone and theta 0.75 at LLG, each beaten on seed 0 by its kind's arm with the temperature
    # added, get no more seeds
    assert queue[-4:] == [("toy-gpu-screen", f"hybrid-{kind}-temp-w128", seed) for seed in (1, 2)
                          for kind in ("tapa", "nope")]
    assert not any(s for _, a, s in queue if a in ("hybrid-tapa-w128", "hybrid-nope-w128", "hybrid-tapa-theta75-llg"))
    grid = {"single-key": [[5, 5], [5, 5]]}
    jobs = [screen_job("hybrid-tapa", seed, [10.0, 20.0], [30.0, 40.0], grid) for seed in (0, 1, 2)]
    jobs += [screen_job("hybrid-nope", 0, [10.0, 20.0], [30.0, 40.0], grid),
             screen_job("hybrid-tapa-w64", 0, [10.0, 20.0], [30.0, 40.0], grid),
             screen_job("hybrid-tapa-temp", 1, [10.0, 20.0], [30.0, 40.0], grid),
             screen_job("hybrid-nope", 0, [10.0, 20.0], [30.0, 40.0], grid, protocol="toy-gpu-c4096"),
             screen_job("hybrid-nope-temp", 0, [10.0, 20.0], [30.0, 40.0], grid, protocol="scale-768-confirm"),
             # stopped at its call's budget: partial, and still queued
             screen_job("hybrid-nope-temp", 1, [10.0, 20.0], [30.0, 40.0], grid, lacking=("passkey", "theory"))]
    text = screen_text(tmp_path, jobs)
    assert "| hybrid-tapa | toy-gpu-screen | 0, 1, 2 | - | - |" in text
    assert "| hybrid-nope-w64 | toy-gpu-screen | not run | - | 0 |" in text
    assert "| hybrid-tapa-temp | toy-gpu-screen | 1 | - | 0, 2 |" in text  # run seeds leave the queue
    assert "| hybrid-nope-temp | toy-gpu-screen | not run | 1 (no passkey, theory) | 0, 1, 2 |" in text
    assert "| hybrid-nope | toy-gpu-c4096 | 0 | - | - |" in text
    assert "| hybrid-tapa | toy-gpu-c4096 | not run | - | 0 |" in text
    left = len(queue) - 5  # five of the jobs above are queued ones (hybrid-tapa seeds 1-2 are not)
    assert f"Run: 5 of {len(plan)} arms, 1 with 3+ seeds. A partial job's tables" in text
    assert f"Queued: {left} jobs, in order: hybrid-nope-temp seed 1, hybrid-tapa-temp seed 2," in text
    assert "hybrid-tapa (toy-gpu-c4096) seed 0, hybrid-tapa-temp-w128 seed 1," in text  # seed 0 before the other seeds
    assert ("--protocol toy-gpu-screen --concurrent 1 --time-budget 560 --allow-partial "
            "--jobs hybrid-nope-temp:0.001:1`") in text  # one job a call: two would not fit its 600 s
    # the confirmation: one job a call, seed 0 of every arm before the seeds 1 and 2
    confirm = text[text.index("Confirmation progress"):]
    assert "| hybrid-nope-temp | scale-768-confirm | 0 | - | 1, 2 |" in confirm
    assert "| hybrid-tapa-temp | scale-768-confirm | not run | - | 0, 1, 2 |" in confirm
    assert f"Run: 1 of {len(arms.confirm_plan())} arms, 0 with 3+ seeds. Queued:" in confirm
    assert ("--protocol scale-768-confirm --concurrent 1 --time-budget 560 --allow-partial "
            "--jobs hybrid-tapa-temp:0.001:0`") in confirm
    # every candidate's three seeds first, seed by seed, then the anchors, RoPE + YaRN leading each
    # seed; no job twice
    assert ("hybrid-tapa-temp seed 0, hybrid-tapa-temp-w128 seed 0, hybrid-nope-temp-w128 seed 0, "
            "hybrid-nope-temp seed 1, hybrid-tapa-temp seed 1, hybrid-tapa-temp-w128 seed 1, "
            "hybrid-nope-temp-w128 seed 1, hybrid-nope-temp seed 2,") in confirm
    assert ("hybrid-nope-temp-w128 seed 2, rope-yarn seed 0, hybrid-nope seed 0, hybrid-tapa seed 0, "
            "rope-yarn seed 1, hybrid-nope seed 1, hybrid-tapa seed 1, rope-yarn seed 2,") in confirm
    assert len(arms.confirm_queue()) == len(set(arms.confirm_queue()))
    assert sorted(arms.confirm_queue()) == sorted((p, a, s) for s in (0, 1, 2) for p, a in arms.confirm_plan())
    assert all(arm in arms.ARMS for _, arm in arms.confirm_plan())
    # a report of some arms only is not the screen's progress
    screen.screen([tmp_path], tmp_path / "some", "cmd", arms=["hybrid-tapa"])
    assert "Screen progress" not in (tmp_path / "some" / "screen.md").read_text()


def test_an_arm_whose_goal_is_out_of_reach_runs_its_remaining_seeds_last(tmp_path):
    """With 3 seeds against 3 the goal's Mann-Whitney p reaches 0.05 only when every TAPA seed
    beats every NoPE seed, so one TAPA seed that does not, on one deciding measure, settles the
    goal: the arm's other seeds move to the end of the confirmation's queue. A seed that beats
    every NoPE seed on every measure leaves the queue as it is."""
    hits = lambda h: [[h, h], [h, h]]
    confirm = "scale-768-confirm"

    def confirmation(folder, tapa_16k, tapa_keys):
        folder.mkdir()
        jobs = [screen_job("hybrid-nope-temp", seed, [10.0, 20.0 + 0.1 * seed], [30.0, 40.0],
                           {"multi-key": hits(3 + seed)}, protocol=confirm) for seed in range(3)]
        jobs.append(screen_job("hybrid-tapa-temp-w128", 0, [9.0, tapa_16k], [30.0, 40.0],
                               {"multi-key": hits(tapa_keys)}, protocol=confirm))
        jobs.append(screen_job("hybrid-tapa", 0, [10.0, 20.0], [30.0, 40.0], {}))  # progress is reported only beside a screen job
        text = screen_text(folder, jobs)
        return text, text[text.index("Confirmation progress"):]

    text, progress = confirmation(tmp_path / "within", 19.0, 6)  # better than every NoPE seed on both
    assert "| hybrid-tapa-temp-w128@768 | 1 | within reach |" in text
    assert "| hybrid-tapa-temp-w128 | scale-768-confirm | 0 | - | 1, 2 |" in progress
    assert "hybrid-tapa-temp seed 1, hybrid-tapa-temp-w128 seed 1, hybrid-nope-temp-w128 seed 1," in progress
    assert progress.split(". The next call")[0].endswith("hybrid-tapa seed 2")
    assert "(last: the goal is out of reach)" not in progress and "seeds run last: its goal" not in progress

    # its multi-key 50% does not beat NoPE's seed 2 (50%): whatever seeds 1-2 score, p >= 0.10
    text, progress = confirmation(tmp_path / "keys", 19.0, 5)
    row = next(line for line in text.splitlines() if line.startswith("| hybrid-tapa-temp-w128@768 |"))
    assert row.startswith("| hybrid-tapa-temp-w128@768 | 1 | out of reach (against hybrid-nope-temp@768, multi-key")
    assert "50% against 30% / 40% / 50%, higher is better; p 0.10 at best" in row
    assert "| hybrid-tapa-temp-w128 | scale-768-confirm | 0 | - | 1, 2 (last: the goal is out of reach) |" in progress
    assert "hybrid-tapa-temp seed 1, hybrid-nope-temp-w128 seed 1, hybrid-tapa-temp seed 2," in progress
    assert "hybrid-tapa seed 2, hybrid-tapa-temp-w128 seed 1, hybrid-tapa-temp-w128 seed 2. The next call" in progress

    # perplexity: 20.15 at 16k is above NoPE's seed 0 (20.0)
    text, _ = confirmation(tmp_path / "ppl", 20.15, 9)
    assert "out of reach (against hybrid-nope-temp@768, test ppl 16k: 20.15 against 20.00 / 20.10 / 20.20" in text


def test_tradeoff_plot_sets_far_perplexity_against_multi_key(tmp_path):
    grid = lambda hits: {"multi-key": [[hits, hits], [hits, hits]]}
    jobs = [screen_job("hybrid-tapa", seed, [10.0, 20.0 + seed], [30.0, 40.0], grid(2 + seed)) for seed in (0, 1)]
    jobs.append(screen_job("hybrid-nope-w64", 0, [10.0, 22.0], [30.0, 40.0], grid(8)))
    write_jobs(tmp_path, jobs)
    written = screen.screen([tmp_path], tmp_path / "out", "cmd")
    assert tmp_path / "out" / "tradeoff.png" in written
    assert "![tradeoff](tradeoff.png)" in (tmp_path / "out" / "screen.md").read_text()
    # the plots are 256-colour PNGs (about a third of matplotlib's RGBA in the tree)
    from PIL import Image
    for path in written:
        if path.suffix == ".png":
            with Image.open(path) as image:
                assert image.mode == "P" and image.size[0] > 300, (path.name, image.mode)
    ppl, retrieval = screen.perplexity_rows(jobs), screen.retrieval_rows(jobs)[0]
    values = screen._per_seed(ppl, retrieval)
    assert values[("hybrid-tapa", "test ppl 16k")] == {0: 20.0, 1: 21.0}
    assert values[("hybrid-nope-w64", "multi-key 8k")] == pytest.approx({0: 80.0})
    # without a test-split perplexity there is nothing to set retrieval against
    assert screen.plot_tradeoff([], retrieval, tmp_path / "none.png") is None


def test_the_three_seed_tradeoff_keeps_the_levers_with_three_seeds_beside_the_references(tmp_path):
    grid = lambda hits: {"multi-key": [[hits, hits], [hits, hits]]}
    jobs = [screen_job(arm, seed, [10.0, 20.0 + seed], [30.0, 40.0], grid(2 + seed), protocol)
            for arm, seeds, protocol in (("hybrid-tapa-temp", 3, "toy-gpu-screen"),
                                         ("hybrid-nope-w64", 2, "toy-gpu-screen"),
                                         ("hybrid-tapa", 1, "toy-gpu-screen"),
                                         ("hybrid-nope", 1, "toy-gpu-screen"),
                                         ("hybrid-tapa-temp", 3, "scale-768-confirm"),
                                         ("hybrid-nope", 1, "scale-768-confirm"))
            for seed in range(seeds)]
    ppl, retrieval = screen.perplexity_rows(jobs), screen.retrieval_rows(jobs)[0]
    x, y, points = screen.tradeoff_points(ppl, retrieval, min_seeds=3)
    assert (x, y) == ("test ppl 16k", "multi-key 8k")
    # the two-seed lever leaves; the one-seed bases stay, at each scale
    assert sorted(points) == ["hybrid-nope", "hybrid-nope@768", "hybrid-tapa", "hybrid-tapa-temp",
                              "hybrid-tapa-temp@768"]
    assert points["hybrid-tapa-temp"] == [(20.0, 20.0), (21.0, 30.0), (22.0, 40.0)]
    assert sorted(screen.tradeoff_points(ppl, retrieval)[2]) == sorted(set(points) | {"hybrid-nope-w64"})
    # a protocol lever on a base is a lever, not a reference
    assert not screen._is_reference("hybrid-tapa@c4096") and screen._is_reference("rope-yarn@768")
    # with no lever at three seeds the plot is not drawn; the every-arm plot still is
    few = [j for j in jobs if "temp" not in j["arm"]]
    few_ppl, few_retrieval = screen.perplexity_rows(few), screen.retrieval_rows(few)[0]
    assert screen.plot_tradeoff(few_ppl, few_retrieval, tmp_path / "three.png", min_seeds=3) is None
    assert screen.plot_tradeoff(few_ppl, few_retrieval, tmp_path / "all.png") == tmp_path / "all.png"
    assert screen.plot_tradeoff(ppl, retrieval, tmp_path / "three.png", min_seeds=3) == tmp_path / "three.png"


def test_tradeoff_names_stay_inside_the_axes_and_apart():
    # three means close together at the bottom edge: the names move up, not below the axes
    spots = screen.label_spots([(0.5, 0.01), (0.52, 0.0), (0.55, 0.005)])
    assert spots[0] == (0.5, 0.01)
    assert all(0.0 <= v <= 0.95 for _, v in spots)
    assert all(abs(a[1] - b[1]) >= 0.03 - 1e-9 for i, a in enumerate(spots) for b in spots[i + 1:])
    # a name far across from the others keeps its own height
    assert screen.label_spots([(0.1, 0.5), (0.9, 0.5)]) == [(0.1, 0.5), (0.9, 0.5)]
    # near the top a name moves down
    assert screen.label_spots([(0.5, 0.99)]) == [(0.5, pytest.approx(0.93))]


def test_anchors_bring_only_the_rope_yarn_jobs_and_the_goal_reads_them(tmp_path):
    grid = {"multi-key": [[5, 5], [5, 5]]}
    main, other = tmp_path / "main", tmp_path / "other"
    main.mkdir(), other.mkdir()
    for seed in (0, 1, 2):
        (main / f"t{seed}.job.json").write_text(json.dumps(screen_job("hybrid-tapa-llg", seed, [10.0, 20.0], [30.0, 40.0], grid)))
        (main / f"n{seed}.job.json").write_text(json.dumps(screen_job("hybrid-nope", seed, [10.0, 21.0], [30.0, 40.0], grid)))
    (other / "r0.job.json").write_text(json.dumps(screen_job("rope-yarn", 0, [10.0, 19.0], [30.0, 40.0], grid)))
    (other / "x0.job.json").write_text(json.dumps(screen_job("retrofit-tapa", 0, [10.0, 30.0], [30.0, 40.0], grid)))
    screen.screen([main], tmp_path / "without", "cmd")
    assert "no rope-yarn arm with shared seeds" in (tmp_path / "without" / "screen.md").read_text()
    # the anchor's folder twice: its rope-yarn job counts once, the retrofit there not at all
    screen.screen([main], tmp_path / "with", "cmd", anchors=[other, other / "r0.job.json"])
    text = (tmp_path / "with" / "screen.md").read_text()
    assert "not met (x1.053, seeds 0)" in text  # 20 / 19 at 16k
    assert "| rope-yarn |" in text and "retrofit-tapa" not in text
    with open(tmp_path / "with" / "perplexity.csv", newline="") as handle:
        assert sum(r["arm"] == "rope-yarn" and r["length"] == "16384" for r in csv.DictReader(handle)) == 2  # test, domain
    with pytest.raises(ValueError, match="no rope-yarn job"):
        screen.screen([main], tmp_path / "none", "cmd", anchors=[main])
    # the anchor's job among the inputs as well: still once
    (main / "r0.job.json").write_text((other / "r0.job.json").read_text())
    screen.screen([main], tmp_path / "both", "cmd", anchors=[other])
    with open(tmp_path / "both" / "perplexity.csv", newline="") as handle:
        assert sum(r["arm"] == "rope-yarn" and r["length"] == "16384" for r in csv.DictReader(handle)) == 2


def test_power_of_the_goal_criterion():
    from lab.study import power

    assert power.power(0.0, 1.0, trials=400) <= 0.05  # no true difference: at most the test's level
    assert power.power(10.0, 1.0, trials=200) == 1.0  # a gap of ten spreads: every draw separates
    weak, strong = power.power(0.5, 1.0, trials=400), power.power(2.0, 1.0, trials=400)
    assert weak < strong
    assert power.power(1.0, 1.0, seeds=5, trials=400) > power.power(1.0, 1.0, seeds=3, trials=400)
    with pytest.raises(ValueError, match="seeds >= 2"):
        power.power(1.0, 1.0, seeds=1)


def test_item_recall_of_the_several_item_tasks_is_tabled_where_jobs_have_it(tmp_path):
    """multi-value's item recall (tapa eval's grids since 2026-12-06) goes to retrieval.csv and a
    table of its own, beyond the window then over every depth; a job without it is left out of the
    table, not counted as 0."""
    none = [[0, 0], [0, 0]]
    jobs = [screen_job("hybrid-tapa", 0, [10.0, 20.0], [30.0, 40.0], {"multi-value": none}),
            screen_job("hybrid-nope", 0, [11.0, 21.0], [31.0, 41.0], {"multi-value": none, "single-key": none}),
            screen_job("hybrid-nope", 1, [11.0, 21.0], [31.0, 41.0], {"multi-value": none})]
    # depths 0.0 (beyond the 256-token window) and 1.0 (next to the question)
    jobs[1]["results"]["passkey"]["tasks"]["multi-value"]["recall"] = [[0.25, 0.75], [0.5, 1.0]]
    jobs[1]["results"]["passkey"]["tasks"]["single-key"]["recall"] = [[0.5, 0.5], [0.5, 0.5]]
    text = screen_text(tmp_path, jobs)
    assert "**multi-value, item recall**" in text and "**single-key, item recall**" not in text
    table = text[text.index("**multi-value, item recall**"):].split("\n\n")[1]
    assert "| hybrid-nope | 25; all 50 | 50; all 75 |" in table  # seed 0 alone: seed 1 has no recall
    assert "hybrid-tapa" not in table
    rows = list(csv.DictReader(open(tmp_path / "out" / "retrieval.csv")))
    nope0 = [r for r in rows if (r["arm"], r["seed"], r["task"]) == ("hybrid-nope", "0", "multi-value")]
    assert [float(r["far_recall"]) for r in nope0] == [0.25, 0.5]
    assert all(r["recall"] == "nan" for r in rows if r["arm"] == "hybrid-tapa")


def test_theory_table_keeps_the_same_arm_under_two_protocols_apart(tmp_path):
    """The confirmation (91M) runs arms and seeds the screen (30M) ran too: the theory table gives
    each its own row, named as the other tables name it, instead of one run replacing the other."""
    def theory(variances):
        return {"layer": 7, "kind": "tapa", "fields": ["estimate", "distance", "mean", "var"],
                "rows": [["trained", d, 0.0, v] for d, v in zip((1.0, 26.0, 3400.0), variances)]}

    small = screen_job("hybrid-tapa-temp", 0, [10.0, 20.0], [30.0, 40.0], {})
    large = screen_job("hybrid-tapa-temp", 0, [9.0, 18.0], [28.0, 36.0], {}, protocol="scale-768-confirm")
    small["results"]["theory"], large["results"]["theory"] = theory([5, 8, 4]), theory([5, 10, 9])
    text = screen_text(tmp_path, [small, large])
    table = next(part for part in text.split("\n\n") if part.startswith("| arm | seed | layer |"))
    rows = {line.split(" | ")[0].strip("| "): line for line in table.splitlines()[2:]}
    assert set(rows) == {"hybrid-tapa-temp", "hybrid-tapa-temp, 91M (scale-768)"}
    assert rows["hybrid-tapa-temp"].endswith("| -50% |")
    assert rows["hybrid-tapa-temp, 91M (scale-768)"].endswith("| -10% |")


def test_an_evaltemp_arm_is_read_against_its_own_run_without_the_temperature(tmp_path):
    """An eval-time temperature job that kept its plain readings is set against them (arm
    ARM-plain), not against the base arm's separate run; that twin is set against the base (the
    two runs' numeric draw), and a job without plain readings still falls back to the base."""
    full, half = [[10, 10], [10, 10]], [[5, 5], [5, 5]]
    base = screen_job("hybrid-nope", 0, [10.0, 20.0], [30.0, 40.0], {"single-key": half})
    tempered = screen_job("hybrid-nope-evaltemp", 0, [9.0, 15.0], [27.0, 30.0], {"single-key": full})
    plain = screen_job("hybrid-nope-evaltemp", 0, [10.0, 25.0], [30.0, 50.0], {"single-key": half})
    tempered["eval_temperature"] = True
    for stage in ("eval1", "domain1", "passkey"):
        tempered["results"][stage]["without_temperature"] = {"label": "plain", **plain["results"][stage]}
    older = screen_job("hybrid-tapa-evaltemp", 0, [9.0, 18.0], [27.0, 36.0], {"single-key": full})
    older["eval_temperature"] = True
    text = screen_text(tmp_path, [base, tempered, older,
                                  screen_job("hybrid-tapa", 0, [10.0, 20.0], [30.0, 40.0], {"single-key": half})])
    levers = next(part for part in text.split("\n\n") if part.startswith("| arm | base |"))
    rows = {line.split(" | ")[0].strip("| "): line for line in levers.splitlines()[2:]}
    # against its own plain reading: 9/10 and 15/25 - 1 on the test split, 27/30 and 30/50 on the
    # domain; single-key 100 - 50 = +50 points
    assert "| hybrid-nope-evaltemp-plain | 0 | -10.0% | -40.0% | -10.0% | -40.0% | +50 | +50 |" in rows["hybrid-nope-evaltemp"]
    assert "| hybrid-nope | 0 | +0.0% | +25.0% | +0.0% | +25.0% | +0 | +0 |" in rows["hybrid-nope-evaltemp-plain"]
    assert "| hybrid-tapa | 0 | -10.0% | -10.0% | -10.0% | -10.0% | +50 | +50 |" in rows["hybrid-tapa-evaltemp"]
    csv_rows = list(csv.DictReader(open(tmp_path / "out" / "perplexity.csv")))
    assert {r["label"] for r in csv_rows if r["arm"] == "hybrid-nope-evaltemp-plain"} == {
        "hybrid-nope-evaltemp, read without the temperature"}


def test_summary_table_gives_each_arms_means_ratio_to_rope_and_pooled_retrieval(tmp_path):
    """The glance table: arms with 3 seeds, the bases and RoPE + YaRN, sorted by the longest
    length's mean perplexity within a scale (91M first); the ratio to RoPE + YaRN of the same
    scale; retrieval at 8x pretraining pooled over seeds; a one-seed lever is left out, and so is
    a base arm under a protocol lever (@c4096), which is a lever, not the base."""
    hits = lambda h: [[h, h], [h, h]]
    jobs = []
    for seed in range(3):
        jobs += [screen_job("hybrid-tapa-temp", seed, [10.0, 18.0 + seed], [30.0, 40.0], {"multi-key": hits(seed)}),
                 screen_job("hybrid-nope", seed, [10.0, 20.0 + seed], [30.0, 40.0], {"multi-key": hits(9)})]
    jobs += [screen_job("hybrid-tapa-w64", 0, [10.0, 15.0], [30.0, 40.0], {}),
             screen_job("hybrid-nope", 0, [10.0, 14.0], [30.0, 40.0], {}, protocol="toy-gpu-c4096"),
             screen_job("rope-yarn", 0, [10.0, 38.0], [30.0, 40.0], {}),
             screen_job("rope-yarn", 0, [9.0, 30.0], [30.0, 40.0], {}, protocol="scale-768-confirm"),
             screen_job("hybrid-tapa", 0, [9.0, 15.0], [30.0, 40.0], {}, protocol="scale-768-confirm")]
    for job in jobs:
        job["protocol"]["pretrain_len"] = 1024  # so 8x is the grid's 8192
    text = screen_text(tmp_path, jobs)
    table = next(part for part in text.split("\n\n") if part.startswith("| arm | seeds | ppl 4k"))
    rows = [line.split(" | ") for line in table.splitlines()[2:]]
    assert [r[0].strip("| ") for r in rows] == ["hybrid-tapa@768", "rope-yarn@768", "hybrid-tapa-temp",
                                                 "hybrid-nope", "rope-yarn"]
    tapa = rows[2]
    # 16k: mean 19, sd 1, 19 / 38; multi-key at 8k: (0 + 1 + 2) hits of 10 in a depth cell, the
    # 1.0 depth beyond the window; pooled 3 of 30
    assert tapa[1:6] == ["3", "10.00", "19.00", "1.00", "x0.500"]
    assert rows[3][5] == "x0.553" and rows[0][5] == "x0.500"
    assert tapa[6].startswith("10%") and rows[3][6].startswith("90%")
    assert rows[4][6].strip("| ") == ""  # no retrieval run: an empty cell, not 0%


def test_summary_table_names_the_seeds_of_a_retrieval_cell_a_partial_job_left_short(tmp_path):
    """An arm with three seeds of perplexity, one of them a partial job that stopped before the
    retrieval suite: its retrieval cell pools two seeds and says so; a full arm's cell does not."""
    hits = lambda h: [[h, h], [h, h]]
    jobs = [screen_job("rope-yarn", 0, [10.0, 38.0], [30.0, 40.0], {})]
    for seed in range(3):
        jobs.append(screen_job("hybrid-tapa", seed, [10.0, 18.0], [30.0, 40.0], {"multi-key": hits(2)}))
        lacking = ("passkey-hybrid-nope",) if seed == 2 else ()
        jobs.append(screen_job("hybrid-nope", seed, [10.0, 20.0], [30.0, 40.0],
                               {} if lacking else {"multi-key": hits(4)}, lacking=lacking))
    for job in jobs:
        job["protocol"]["pretrain_len"] = 1024
    text = screen_text(tmp_path, jobs)
    table = next(part for part in text.split("\n\n") if part.startswith("| arm | seeds | ppl 4k"))
    rows = {r[0].strip("| "): r for r in (line.split(" | ") for line in table.splitlines()[2:])}
    assert rows["hybrid-nope"][1] == "3" and rows["hybrid-nope"][6].strip("| ") == "40% (2 seeds)"
    assert rows["hybrid-tapa"][6].strip("| ") == "20%"
    goal = next(line for line in text.splitlines() if line.startswith("| hybrid-tapa | hybrid-nope |"))
    assert "not measured (fewer than 3 seeds)" in goal  # multi-key: two NoPE seeds, no verdict
