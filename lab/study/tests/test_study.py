"""The toy study's tooling: the runner (lab/study/run.py) end to end on the tiny CPU protocol,
its plans, and the aggregation of job JSONs (lab/study/aggregate.py) on a known case."""

import copy
import importlib.util
import csv
import json
import math
import tarfile
from pathlib import Path

import pytest

from lab.study import aggregate as study
from lab.study import arms, code_tree, plan, run

# ---------------------------------------------------------------------------------------------
# the runner


@pytest.fixture(scope="module")
def study_root(tmp_path_factory):
    return tmp_path_factory.mktemp("study")


def archive_jobs(out: Path) -> dict[str, dict]:
    (archive,) = out.glob("study-*.tar.gz")
    with tarfile.open(archive) as tar:
        names = tar.getnames()
        assert "batch.json" in names and "corpus/tokenizer.json" in names
        assert any(n.startswith("logs/") for n in names)
        return {m.name: json.load(tar.extractfile(m)) for m in tar.getmembers() if m.name.endswith(".job.json")}


@pytest.mark.slow  # two worker processes, each a few seconds of imports
def test_runner_end_to_end_two_jobs_at_once(study_root, capsys):
    out = study_root / "out1"
    rc = run.main(["--protocol", "tiny-cpu", "--jobs", "rope-eval-yarn:0.001:0,nope:0.001:0",
                   "--concurrent", "2", "--root", str(study_root), "--out", str(out),
                   "--progress-every", "1", "--time-budget", "300"])
    printed = capsys.readouterr().out
    assert rc == 0, printed
    assert "rope-lr0.001-s0: started" in printed and "nope-lr0.001-s0: done" in printed
    jobs = archive_jobs(out)
    assert sorted(jobs) == ["jobs/nope-lr0.001-s0.job.json", "jobs/rope-eval-yarn-lr0.001-s0.job.json"]
    protocol = arms.TINY_CPU
    for job in jobs.values():
        assert job["complete"] and job["stages_done"][0] == "pretrain"
        assert job["results"]["pretrain"]["tokens"] == protocol.pretrain_tokens
        assert job["results"]["continual"]["tokens"] == protocol.continual_tokens
        # the continual stage runs at the protocol's fraction of the pretraining lr
        assert math.isclose(job["results"]["continual"]["train"]["lr"], 0.001 * protocol.continual_lr_scale)
        assert job["continual_lr_scale"] == protocol.continual_lr_scale  # what the aggregate labels
        assert job["results"]["pretrain"]["train"]["lr"] == 0.001
        for stage in ("eval0", "eval1"):
            lengths = [r["length"] for r in job["results"][stage]["perplexity"]]
            assert lengths == list(protocol.eval_lengths)
            assert all(r["tokens"] == protocol.eval_tokens for r in job["results"][stage]["perplexity"])
        grid = job["results"]["passkey"]["passkey"]
        assert grid["lengths"] == list(protocol.passkey_lengths) and grid["trials"] == 2
        owner = job["arm"] == "nope"  # rope-eval-yarn reads the RoPE arm's run: no theory of its own
        # tiny-cpu has no second domain: no domain stages
        assert set(job["commands"]) == (set(arms.stages_of(protocol))
                                        - ({"theory"} if not owner else set()))
        assert job["commands"]["pretrain"].startswith("tapa train --recipe tiny")
        assert job["corpus"]["train_tokens"] > 0 and job["hardware"]
        assert job["code"]["src_tree"] == code_tree.tree_id(code_tree.ROOT / "src" / "tapa")  # which code ran
        if importlib.util.find_spec("triton") is not None:  # the kernels each stage trained with
            assert set(job["kernels"]) >= {"pretrain", "continual"}
            assert set(job["kernels"]["pretrain"]) == {"128", "64"}
    # the worker got the call's deadline and the estimates it checks evaluations against
    spec = json.loads((study_root / "runs" / "nope-lr0.001-s0" / "worker.json").read_text())
    assert spec["deadline_unix"] > 1.7e9 and spec["estimates"]["eval_s_per_method"] == arms.TINY_ESTIMATES.eval_s_per_method
    theory = jobs["jobs/nope-lr0.001-s0.job.json"]["results"]["theory"]
    estimates = {row[0] for row in theory["rows"]}
    assert theory["kind"] == "nope" and {"trained", "trained-centered", "iid-empirical"} <= estimates
    yarn = jobs["jobs/rope-eval-yarn-lr0.001-s0.job.json"]
    assert yarn["results"]["eval0"]["pe"] == "rope-yarn" and yarn["results"]["eval0"]["trained_pe"] == "rope"
    assert "--eval-pe rope-yarn" in yarn["commands"]["eval1"]
    # the archive aggregates: tables and a README come out of it
    written = study.aggregate([out], study_root / "agg")
    assert {p.name for p in written} >= {"README.md", "perplexity_zero_shot.png", "passkey.md",
                                         "theory_trained.png"}


def test_worker_starts_no_evaluation_it_cannot_finish(tmp_path, monkeypatch):
    """StagePace: training stages always start (they checkpoint); an evaluation starts only if its
    expected time fits before the deadline: the estimate at first, then scaled by how much slower
    than estimated this call's evaluations ran (their done markers), or its kind's own measured
    rate."""
    from lab.study.summarize import done_marker, write_json_atomic

    (group,) = plan.build_groups([plan.Job("nope", 0.001, 0)], arms.TINY_CPU, list(arms.STAGES), Path("/r"))
    stages = {s.kind: vars(s) for s in group.stages}
    est = arms.Estimates(eval_s_per_method=10.0, passkey_s_per_method=20.0, theory_s=5.0)
    now = [1000.0]
    monkeypatch.setattr(run.time, "time", lambda: now[0])
    spec = {"deadline_unix": 1030.0, "estimates": json.loads(json.dumps(vars(est))), "level": 1,
            "group": group.id, "call": "c1", "stages": [vars(s) for s in group.stages]}
    pace = run.StagePace(spec, tmp_path)
    assert pace.estimates.speedup[1] == 1.0  # the JSON round trip's string keys are ints again
    assert pace.too_late(stages["eval0"]) is None  # 10 s of 30
    assert pace.too_late(stages["passkey"]) is None  # 20 s of 30
    now[0] = 1015.0
    assert pace.too_late(stages["passkey"]) == "needs ~20 s, 15 s left"
    assert pace.too_late(stages["pretrain"]) is None and pace.too_late(stages["continual"]) is None
    now[0] = 1000.0
    # eval0 finished in this call at 2.5x its estimate: this GPU is slower than estimated
    marker = done_marker(tmp_path, group.id, stages["eval0"]["name"])
    marker.parent.mkdir(parents=True)
    write_json_atomic(marker, {"argv": stages["eval0"]["argv"], "wall_s": 25.0, "call": "c1"})
    assert pace.too_late(stages["passkey"]) == "needs ~50 s, 30 s left"
    assert pace.expected(stages["eval1"]) == 25.0  # its kind's measured rate, not the scaled estimate
    assert pace.too_late(stages["eval1"]) is None
    assert run.StagePace({**spec, "call": "c2"}, tmp_path).too_late(stages["passkey"]) is None  # another call's
    assert run.StagePace({**spec, "deadline_unix": None}, tmp_path).too_late(stages["passkey"]) is None


@pytest.mark.slow  # reads the runs the end-to-end test above leaves in study_root
def test_runner_skips_finished_stages_and_respects_the_budget(study_root, capsys):
    out = study_root / "out2"
    # the group finished above: nothing to run again; a new one cannot fit in 1 s
    rc = run.main(["--protocol", "tiny-cpu", "--jobs", "nope:0.001:0,nope:0.002:0", "--root", str(study_root),
                   "--out", str(out), "--time-budget", "16", "--pack-reserve", "15", "--progress-every", "0"])
    assert rc == 1
    batch = json.loads((out / "batch.json").read_text())
    assert batch["groups"]["nope-lr0.001-s0"]["state"] == "done"
    assert batch["groups"]["nope-lr0.002-s0"]["state"] == "not started"
    assert list(archive_jobs(out)) == ["jobs/nope-lr0.001-s0.job.json"]  # rebuilt from the markers
    assert "not started" in capsys.readouterr().out


@pytest.mark.slow  # reads the runs the end-to-end test above leaves in study_root
def test_runner_reruns_stages_whose_flags_changed(study_root, capsys, monkeypatch):
    """On a still-warm machine, a protocol change between calls (here the continual lr) re-runs
    the stages whose flags changed and those that read them; the others stay done."""
    import dataclasses

    changed = dataclasses.replace(arms.TINY_CPU, continual_lr_scale=0.5)
    monkeypatch.setitem(arms.PROTOCOLS, "tiny-cpu", changed)
    out = study_root / "out3"
    rc = run.main(["--protocol", "tiny-cpu", "--jobs", "nope:0.001:0", "--root", str(study_root),
                   "--out", str(out), "--time-budget", "300", "--progress-every", "0"])
    assert rc == 0
    log = (study_root / "logs" / "nope-lr0.001-s0.log").read_text().split("##### call")[-1]
    for name in ("pretrain", "eval0", "theory"):
        assert f"== {name}: done in an earlier call\n" in log, name
    for name in ("continual-nope", "eval1-nope", "passkey-nope"):
        assert f"== {name}: done in an earlier call with other flags" in log, name
    job = archive_jobs(out)["jobs/nope-lr0.001-s0.job.json"]
    assert job["complete"] and job["protocol"]["continual_lr_scale"] == job["continual_lr_scale"] == 0.5
    assert math.isclose(job["results"]["continual"]["train"]["lr"], 0.0005)
    capsys.readouterr()


def test_skip_done_leaves_out_only_complete_jobs_of_this_protocol(tmp_path, capsys):
    """--skip-done: a plan runs what is missing. A job counts as done only when its JSON is
    complete, of this protocol's full id, and ran every stage kind asked for now."""
    full_id = arms.TOY_GPU.fingerprint()
    other = {**arms.TOY_GPU.to_dict(), "pretrain_steps": 10}
    stages = ["pretrain", "eval0", "theory", "continual-tapa", "eval1-tapa", "passkey-tapa"]
    for name, job_id, protocol, complete, done in (
            ("a", "tapa:0.002:2", None, True, stages),  # done
            ("b", "tapa:0.002:3", other, True, stages),  # another protocol
            ("c", "tapa:0.002:4", None, False, stages[:2]),  # stopped at the budget
            ("d", "nope:0.001:2", None, True, stages[:2]),  # zero-shot only
            # an eval-time arm reads its owner's run: no theory stage of its own, yet done
            ("e", "rope-eval-yarn:0.001:2", None, True,
             ["pretrain", "eval0", "continual-rope", "eval1-rope", "passkey-rope"]),
            ("f", "rope-eval-yarn:0.001:3", None, True, ["pretrain", "eval0"])):
        arm, lr, seed = job_id.split(":")
        job = synthetic_job(arm, arm, float(lr), int(seed), [10] * 6, complete=complete, stages_done=done)
        if protocol is not None:
            job["protocol"] = protocol
        (tmp_path / f"{name}.job.json").write_text(json.dumps(job))
    assert run.done_jobs(tmp_path, full_id, arms.stages_of(arms.TOY_GPU)) == {"tapa:0.002:2", "rope-eval-yarn:0.001:2"}
    assert run.done_jobs(tmp_path, full_id, ["pretrain", "eval0"]) == {
        "tapa:0.002:2", "nope:0.001:2", "rope-eval-yarn:0.001:2", "rope-eval-yarn:0.001:3"}
    args = run.parse_args(["--plan", "seeds", "--families", "tapa,nope", "--arms", "tapa,nope",
                           "--lr", "tapa=0.002,nope=0.001", "--seeds", "2,3,4", "--skip-done", str(tmp_path)])
    _, _, jobs, _ = run.configure(args)
    assert {job.id for job in jobs} == {"tapa:0.002:3", "tapa:0.002:4", "nope:0.001:2", "nope:0.001:3",
                                        "nope:0.001:4"}
    assert "skipping 1 job(s)" in capsys.readouterr().out
    # a job still to run that trains a done owner's pretraining again: the owner rides along (a
    # repeat of it); a done job of another pretraining, or one the plan does not hold, does not
    args = run.parse_args(["--plan", "seeds", "--families", "tapa", "--arms", "tapa,tapa-theta75",
                           "--lr", "tapa=0.002", "--seeds", "2", "--skip-done", str(tmp_path)])
    _, _, jobs, _ = run.configure(args)
    assert [job.id for job in jobs] == ["tapa-theta75:0.002:2"]  # theta 0.75: another pretraining
    args = run.parse_args(["--plan", "seeds", "--families", "rope", "--arms", "rope-eval-yarn,rope-eval-pi",
                           "--lr", "rope=0.001", "--seeds", "2", "--skip-done", str(tmp_path)])
    _, _, jobs, _ = run.configure(args)
    assert [job.id for job in jobs] == ["rope-eval-pi:0.001:2"]  # its owner, rope, is not in the plan
    (tmp_path / "g.job.json").write_text(json.dumps(synthetic_job(
        "rope", "rope", 1e-3, 2, [10] * 6, complete=True, stages_done=stages[:3] + [
            "continual-rope", "eval1-rope", "passkey-rope"])))
    args = run.parse_args(["--plan", "seeds", "--families", "rope", "--arms", "rope,rope-eval-yarn,rope-eval-pi",
                           "--lr", "rope=0.001", "--seeds", "2", "--skip-done", str(tmp_path)])
    _, _, jobs, _ = run.configure(args)
    assert [job.id for job in jobs] == ["rope:0.001:2", "rope-eval-pi:0.001:2"]  # rope-eval-yarn stays done
    assert "running 1 done job(s) again with a pretraining they share (a repeat): rope:0.001:2" in \
        capsys.readouterr().out


def test_plan_shares_runs_and_fills_the_protocol():
    jobs = plan.parse_jobs("rope:1e-3:0,rope-yarn:0.001:0,rope-eval-yarn:1e-3:0,tapa:1e-3:1")
    groups = plan.build_groups(jobs, arms.TOY_GPU, arms.stages_of(arms.TOY_GPU), Path("/r"))
    rope, tapa = groups
    assert [len(g.jobs) for g in groups] == [3, 1] and rope.id == "rope-lr0.001-s0"
    assert [s.name for s in rope.stages] == ["pretrain", "eval0", "theory", "continual-rope", "eval1-rope",
                                             "passkey-rope", "continual-rope-yarn", "eval1-rope-yarn",
                                             "passkey-rope-yarn"]
    assert rope.stage("theory").command().startswith("python3 -m tapa.theory.trained /r/runs/rope-")
    assert rope.stage("eval0").argv[-2:] == ["--eval-pe", "rope-yarn"]
    yarn = rope.stage("continual-rope-yarn").argv
    assert yarn[yarn.index("--rope-scale") + 1] == "4" and yarn[yarn.index("--original-seq-len") + 1] == "512"
    assert rope.stage("pretrain").tokens == 3052 * 64 * 512 >= 100_000_000
    for stage in ("pretrain", "continual-rope", "continual-rope-yarn"):  # argparse keeps the last --lr
        argv = rope.stage(stage).argv
        last_lr = float(argv[len(argv) - argv[::-1].index("--lr")])
        assert math.isclose(last_lr, 1e-3 * (1 if stage == "pretrain" else arms.TOY_GPU.continual_lr_scale))
    assert "--phase-lr-scale" in tapa.stage("pretrain").argv
    sweep = plan.plan_jobs("lr-sweep", arms.TOY_GPU)
    assert len(sweep) == 12 and {j.arm for j in sweep} == {"rope", "nope", "tapa", "hybrid-tapa"}
    seeds = plan.plan_jobs("seeds", arms.TOY_GPU, lrs={"rope": 1e-3, "nope": 2e-3, "tapa": 1e-3,
                                                       "hybrid": 5e-4})
    assert len(seeds) == 3 * len(arms.ARMS)
    with pytest.raises(ValueError, match="--lr"):
        plan.plan_jobs("seeds", arms.TOY_GPU, lrs={"rope": 1e-3})
    # An arm's own lr wins over its family's; only that arm moves.
    lrs = plan.parse_lr_map("rope=1e-3,nope=2e-3,tapa=2e-3,hybrid=5e-4,tapa-linear=5e-4")
    own = {j.arm: j.lr for j in plan.plan_jobs("seeds", arms.TOY_GPU, lrs=lrs, seeds=[4])}
    assert own["tapa-linear"] == 5e-4 and own["tapa"] == own["tapa-theta75"] == 2e-3
    with pytest.raises(ValueError, match="name=lr"):
        plan.parse_lr_map("no-such-arm=1e-3")
    with pytest.raises(ValueError, match="arm:lr:seed"):
        plan.parse_jobs("rope:1e-3")
    bad = plan.build_groups(plan.parse_jobs("nope:1e-3:0"), arms.TOY_GPU, ["pretrain"], Path("/r"))
    assert plan.check_flags(bad) == []
    bad[0].stages[0].argv.append("--no-such-flag")
    assert "--no-such-flag" in plan.check_flags(bad)[0]
    batches = plan.split_batches(plan.build_groups(sweep, arms.TOY_GPU, ["pretrain"], Path("/r")),
                                 arms.Estimates(), concurrent=3, budget_s=500, calls=3)
    assert sum(len(b) for b in batches) == 12


def test_a_slower_protocol_scales_every_model_stage_estimate():
    """scale-768's model is slower per token in training and in evaluation alike: its eval,
    passkey, retrieval-suite and theory estimates grow by 1 / rate_scale with the training rate (not only the
    training stages), so the runner does not start a group whose evaluations cannot fit."""
    _, small, _, _ = run.configure(run.parse_args(["--protocol", "toy-gpu", "--jobs", "rope:0.001:0"]))
    _, big, _, _ = run.configure(run.parse_args(["--protocol", "scale-768", "--jobs", "rope:0.001:0"]))
    scale = arms.SCALE_768.rate_scale
    assert big.tokens_per_s == pytest.approx(small.tokens_per_s * scale)
    for name in ("eval_s_per_method", "passkey_s_per_method", "task_s_per_prompt", "theory_s"):
        assert getattr(big, name) == pytest.approx(getattr(small, name) / scale), name
    assert big.startup_s == small.startup_s and big.data_build_s == small.data_build_s


def test_an_arms_own_continual_lr_scale_shares_the_pretraining_run():
    """hybrid-tapa-clr03 reads hybrid-tapa's pretraining run and continues at its own 0.3x the lr
    (not the protocol's 0.1x) in a run of its own: cphase's continual flags are the same."""
    jobs = plan.parse_jobs("hybrid-tapa:1e-3:0,hybrid-tapa-cphase:1e-3:0,hybrid-tapa-clr03:1e-3:0")
    (group,) = plan.build_groups(jobs, arms.TOY_GPU, arms.stages_of(arms.TOY_GPU), Path("/r"))
    assert [s.name for s in group.stages if s.kind == "pretrain"] == ["pretrain"]
    assert [s.name for s in group.stages if s.kind == "continual"] == [
        "continual-hybrid-tapa", "continual-hybrid-tapa-cphase", "continual-hybrid-tapa-clr03"]

    def last(argv, flag):  # argparse keeps the last value of a repeated flag
        return argv[len(argv) - argv[::-1].index(flag)]
    clr03 = group.stage("continual-hybrid-tapa-clr03").argv
    assert (last(clr03, "--lr"), last(clr03, "--phase-lr-scale")) == ("0.0003", "1.0")
    assert last(group.stage("continual-hybrid-tapa").argv, "--lr") == "0.0001"
    assert plan.job_stages(jobs[2], arms.stages_of(arms.TOY_GPU)) == ["pretrain", "continual-hybrid-tapa-clr03",
                                                     "eval1-hybrid-tapa-clr03", "passkey-hybrid-tapa-clr03"]


# ---------------------------------------------------------------------------------------------
# aggregation of synthetic job JSONs


def synthetic_job(arm, family, lr, seed, ppl0, ppl1=None, val=3.0, passkey=None, label=None, **extra):
    lengths = [512, 1024, 2048, 4096, 8192, 16384]

    def evaluation(values):
        return {"label": label or arm, "pe": arm, "trained_pe": arm,
                "perplexity": [{"length": n, "perplexity": v, "loss": math.log(v), "tokens": 65536}
                               for n, v in zip(lengths, values)]}
    results = {"pretrain": {"tokens": 100, "final_val_loss": val, "num_parameters": 10,
                            "model": {"dim": 512, "n_layers": 8, "n_heads": 4, "vocab_size": 8192}},
               "eval0": evaluation(ppl0)}
    if ppl1:
        results["eval1"] = evaluation(ppl1)
    if passkey:
        results["passkey"] = {"passkey": {"lengths": [2048, 4096], "depths": [0.0, 1.0], "trials": 50,
                                          "filler": "corpus", "accuracy": passkey}}
    protocol = {**arms.TOY_GPU.to_dict()}
    job = {"kind": "tapa-study-job", "job": f"{arm}:{lr:g}:{seed}", "arm": arm, "label": label or arm,
           "family": family, "lr": lr, "seed": seed, "protocol": protocol, "protocol_id": "p1",
           "stages_done": list(results), "complete": True, "results": results, "hardware": ["H200"],
           "stages_requested": ["pretrain", "eval0"] + ([f"continual-{arm}", f"eval1-{arm}",
                                                         f"passkey-{arm}"] if ppl1 else []),
           "stage_dates": {"pretrain": ["2026-12-01T00:00:00", "2026-12-01T00:05:00"]},
           "commands": {"pretrain": f"tapa train --lr {lr}"}, "date": "2026-12-01T00:06:00",
           "runner": {"call": "c1", "command": "python3 -m lab.study.run --jobs ..."},
           "corpus": {"train_tokens": 120_000_000, "tokenizer_sha256": "abc", "source": {}}}
    job.update(extra)
    return job


def test_aggregate_known_mean_and_std(tmp_path):
    jobs = [
        synthetic_job("tapa", "tapa", 1e-3, 0, [7, 8, 9, 10, 11, 10], [6, 6, 6, 6, 6, 6], val=2.0,
                      passkey=[[1.0, 0.5], [0.0, 0.0]]),
        synthetic_job("tapa", "tapa", 1e-3, 1, [8, 8, 9, 10, 11, 20], [7, 6, 6, 6, 6, 6], val=2.1,
                      passkey=[[0.0, 0.5], [0.0, 1.0]]),
        synthetic_job("tapa", "tapa", 1e-3, 2, [9, 8, 9, 10, 11, 30], [8, 6, 6, 6, 6, 6], val=2.2,
                      passkey=[[0.5, 0.5], [0.0, 0.5]]),
        synthetic_job("tapa", "tapa", 5e-4, 0, [12] * 6, val=2.5),  # the sweep's other lr, one seed
        synthetic_job("rope", "rope", 1e-3, 0, [7, 50, 90, 100, 150, 200], label="RoPE"),
    ]
    (tmp_path / "in").mkdir()
    for index, job in enumerate(jobs):
        (tmp_path / "in" / f"{index}.job.json").write_text(json.dumps(job))
    stale = copy.deepcopy(jobs[0])  # an earlier, unfinished copy of a job is ignored
    stale.update(stages_done=["pretrain"], date="2026-11-30T00:00:00",
                 stage_dates={"pretrain": ["2026-11-30T00:00:00", "2026-11-30T00:05:00"]})
    stale["results"]["eval0"]["perplexity"][0]["perplexity"] = 1000.0
    (tmp_path / "in" / "stale.job.json").write_text(json.dumps(stale))
    # the JSON of an earlier call that ran the first stages of the run a later call resumed: the
    # same measurements (stage dates), so no repeat
    carried = copy.deepcopy(jobs[1])
    carried.update(date="2026-11-30T00:00:00", complete=False)
    (tmp_path / "in" / "carried.job.json").write_text(json.dumps(carried))

    written = study.aggregate([tmp_path / "in"], tmp_path / "out")
    assert {path.name for path in written} <= set(study.OUTPUTS)  # so stale copies can be removed
    rows = {(r["stage"], r["arm"], int(r["length"])): r
            for r in csv.DictReader(open(tmp_path / "out" / "perplexity.csv"))}
    first = rows[("zero-shot", "tapa", 512)]
    assert float(first["lr"]) == 1e-3 and int(first["n"]) == 3  # main lr: the one with 3 seeds
    assert math.isclose(float(first["mean"]), 8.0) and math.isclose(float(first["std"]), 1.0)
    last = rows[("zero-shot", "tapa", 16384)]
    assert math.isclose(float(last["mean"]), 20.0) and math.isclose(float(last["std"]), 10.0)
    assert rows[("zero-shot", "rope", 512)]["std"] == "nan"  # one seed: no spread
    markdown = (tmp_path / "out" / "perplexity_zero_shot.md").read_text()
    assert "| tapa | 3 | 0.001 | 8.00 ± 1.00 |" in markdown and "20.00 ± 10.00" in markdown
    assert "| RoPE | 1 | 0.001 | 7.00 | 50.00 |" in markdown
    sweep = (tmp_path / "out" / "lr_sweep.md").read_text()  # compared on seed 0, common to both lrs
    assert "| tapa | tapa | 0.001 **(best)** | 1 | 2.0000 | 7.00 |" in sweep
    assert "| tapa | tapa | 0.0005 | 1 | 2.5000 | 12.00 |" in sweep
    passkey = list(csv.DictReader(open(tmp_path / "out" / "passkey.csv")))
    cell = next(r for r in passkey if r["length"] == "2048" and r["depth"] == "0.0")
    assert math.isclose(float(cell["mean"]), 0.5) and math.isclose(float(cell["std"]), 0.5)
    assert "| tapa | 3 | 50% | 25% |" in (tmp_path / "out" / "passkey.md").read_text()
    coverage = (tmp_path / "out" / "coverage.md").read_text()
    assert "| tapa | 0.001 | 0,1,2 | 0,1,2 | 0,1,2 | n/a |" in coverage  # no theory stage asked for
    assert "| RoPE | 0.001 | 0 (1/3) | - (0/3) | - (0/3) | - (0/3) |" in coverage
    for name in ("perplexity_zero_shot.png", "perplexity_continual.png", "passkey.png",
                 "passkey_depths.png", "README.md", "commands.md", "jobs.csv"):
        assert (tmp_path / "out" / name).stat().st_size > 0, name
    readme = (tmp_path / "out" / "README.md").read_text()
    assert "![passkey by depth](passkey_depths.png)" in readme
    assert "120,000,000" in readme and "H200" in readme and "TODO (lead)" in readme
    assert readme.startswith("# Toy-scale reproduction study (issue 11)\n")
    # the stale copy is the job's repeat: its 512-token zero-shot number next to the kept one's
    repeats = list(csv.DictReader(open(tmp_path / "out" / "repeats.csv")))
    assert [(r["stage"], r["length"]) for r in repeats][:1] == [("zero-shot", "512")]
    assert {r["job"] for r in repeats} == {"tapa:0.001:0"}
    assert math.isclose(float(repeats[0]["kept"]), 7.0) and math.isclose(float(repeats[0]["repeat"]), 1000.0)
    assert "| 7.00 / 1000 |" in (tmp_path / "out" / "repeats.md").read_text() and "142.86 |" in readme
    assert (tmp_path / "out" / "repeats.png").stat().st_size > 0 and "![repeats](repeats.png)" in readme
    # a second run rewrites the generated parts and keeps the lead's: the headline, each section's
    # text from the notes mark on, and a section of the lead's own; twice gives the same README
    lead = readme.replace("TODO (lead)", "LEAD HEADLINE").replace("## Learning-rate sweep\n",
                          "## Learning-rate sweep\n\n" + study.NOTES_MARK + "\nLEAD NOTE\n")
    lead = lead.replace("| 7.00 / 1000 |", "| edited |") + "\n## Lead's section\n\nLEAD TEXT\n"
    (tmp_path / "out" / "README.md").write_text(lead)
    study.aggregate([tmp_path / "in"], tmp_path / "out")
    merged = (tmp_path / "out" / "README.md").read_text()
    assert "LEAD HEADLINE" in merged and "TODO (lead)" not in merged
    assert merged.count("LEAD NOTE") == 1 and merged.index("LEAD NOTE") > merged.index("training curves")
    assert "| 7.00 / 1000 |" in merged and "| edited |" not in merged and merged.endswith("LEAD TEXT\n")
    study.aggregate([tmp_path / "in"], tmp_path / "out")
    assert (tmp_path / "out" / "README.md").read_text() == merged
    assert not (tmp_path / "out" / "README.skeleton.md").exists()


def test_comparisons_from_the_seeds(tmp_path):
    """comparisons.csv: the pair (tapa, rope) with three seeds each, tapa lower at 512 and with
    no spread difference elsewhere; p-values as tapa.eval.stats computes them from these seeds."""
    from tapa.eval import stats

    tapa = [[7, 8, 9, 10, 11, 10], [8, 8, 9, 10, 11, 20], [9, 8, 9, 10, 11, 30]]
    rope = [[10, 50, 90, 100, 150, 200], [11, 50, 90, 100, 150, 200], [12, 51, 90, 100, 150, 200]]
    (tmp_path / "in").mkdir()
    for seed in range(3):
        for arm, ppl in (("tapa", tapa[seed]), ("rope", rope[seed])):
            job = synthetic_job(arm, arm, 1e-3, seed, ppl, label=arm.upper())
            (tmp_path / "in" / f"{arm}{seed}.job.json").write_text(json.dumps(job))
    study.aggregate([tmp_path / "in"], tmp_path / "out")
    rows = {int(r["length"]): r for r in csv.DictReader(open(tmp_path / "out" / "comparisons.csv"))
            if (r["a"], r["b"]) == ("tapa", "rope")}
    assert sorted(rows) == [512, 1024, 2048, 4096, 8192, 16384]
    first = rows[512]
    t, df, p = stats.welch_t([7, 8, 9], [10, 11, 12])
    assert math.isclose(float(first["welch_t"]), t) and math.isclose(float(first["p_welch"]), p)
    assert math.isclose(t, 3 / math.sqrt(2 / 3)) and math.isclose(df, 4.0)
    assert math.isclose(float(first["p_mann_whitney"]), 1 / 20)  # every tapa seed below every rope seed
    # the other way round, is rope lower: Welch's p is the complement, and no relabelling puts rope lower less
    assert math.isclose(float(first["p_welch_b"]), stats.welch_t([10, 11, 12], [7, 8, 9])[2])
    assert math.isclose(float(first["p_welch_b"]), 1 - p)
    assert math.isclose(float(first["p_mann_whitney_b"]), 1.0)
    assert math.isclose(float(first["ratio"]), 8 / 11)
    assert float(rows[2048]["p_welch"]) != float(rows[2048]["p_welch"])  # no spread on either side: nan
    markdown = (tmp_path / "out" / "comparisons.md").read_text()
    assert (f"| TAPA | ROPE | 512 | 3/3 | 8.00 | 11.00 | 0.727 | 3.67 (4.0) | {p:.3f} | 0.050 | "
            f"{1 - p:.3f} | 1.000 |") in markdown
    assert (tmp_path / "out" / "comparisons.png").stat().st_size > 0  # the pairs seed by seed
    assert "![seed by seed](comparisons.png)" in (tmp_path / "out" / "README.md").read_text()


def test_aggregate_refuses_mixed_protocols(tmp_path):
    """Jobs whose recorded protocols differ in what the numbers depend on are not mixed; a
    plan-only difference (the theory settings, the seeds) keeps them comparable."""
    ids = []
    for index, steps in enumerate((3052, 1000)):
        job = synthetic_job("nope", "nope", 1e-3, 0, [9] * 6)
        job["protocol"] = {**job["protocol"], "pretrain_steps": steps, "seeds": [index]}
        ids.append(study.protocol_fingerprint(job["protocol"]))
        (tmp_path / f"{index}.job.json").write_text(json.dumps(job))
    with pytest.raises(ValueError, match="protocol"):
        study.aggregate([tmp_path], tmp_path / "out")
    assert study.aggregate([tmp_path], tmp_path / "out", protocol_id=ids[1])
    theory_only = {**arms.TOY_GPU.to_dict(), "theory_len": None, "theory_sequences": None}
    assert study.protocol_fingerprint(theory_only) == arms.TOY_GPU.fingerprint()
    assert study.mean_std([2.0, 4.0, 6.0]) == (4.0, 2.0, 3)


def test_fingerprint_parts_keep_old_jobs_comparable():
    """A protocol recorded before continual_lr_scale existed hashes like one at its old value
    (1.0); the pretraining id ignores the continual stage, the full id does not."""
    new = arms.TOY_GPU.to_dict()
    old = {k: v for k, v in new.items() if k != "continual_lr_scale"}
    at_one = {**new, "continual_lr_scale": 1.0}
    assert study.protocol_fingerprint(old) == study.protocol_fingerprint(at_one)
    assert study.protocol_fingerprint(old) != study.protocol_fingerprint(new)
    assert len({study.protocol_fingerprint(p, "pretrain") for p in (old, new, at_one)}) == 1
    longer = {**new, "pretrain_steps": 1000}
    assert study.protocol_fingerprint(longer, "pretrain") != study.protocol_fingerprint(new, "pretrain")
    with pytest.raises(ValueError, match="part"):
        study.protocol_fingerprint(new, "continual")


def test_aggregate_splits_continual_variants_and_counts_a_seed_once(tmp_path):
    """Jobs of one pretraining protocol under two continual stages: the zero-shot table takes
    each (arm, lr, seed) once (the latest run), the continual tables one row per variant."""
    old_protocol = {k: v for k, v in arms.TOY_GPU.to_dict().items() if k != "continual_lr_scale"}
    jobs = [
        synthetic_job("rope", "rope", 1e-3, 0, [8] * 6, [9] * 6, label="RoPE", protocol=old_protocol,
                      date="2026-12-01T01:00:00"),
        synthetic_job("rope", "rope", 1e-3, 0, [10] * 6, [7] * 6, label="RoPE",
                      date="2026-12-02T01:00:00",  # the same seed re-run, new continual stage
                      stage_dates={"pretrain": ["2026-12-02T00:00:00", "2026-12-02T00:05:00"]}),
        synthetic_job("rope", "rope", 1e-3, 1, [12] * 6, [5] * 6, label="RoPE",
                      date="2026-12-02T02:00:00"),
    ]
    for index, job in enumerate(jobs):
        (tmp_path / f"{index}.job.json").write_text(json.dumps(job))
    study.aggregate([tmp_path], tmp_path / "out")
    rows = {(r["stage"], r["label"], int(r["length"])): r
            for r in csv.DictReader(open(tmp_path / "out" / "perplexity.csv"))}
    zero = rows[("zero-shot", "RoPE", 512)]
    assert int(zero["n"]) == 2 and math.isclose(float(zero["mean"]), 11.0)  # seed 0 counted once
    old = rows[("continual", "RoPE [continual lr x1]", 512)]
    new = rows[("continual", "RoPE [continual lr x0.1]", 512)]
    assert (int(old["n"]), float(old["mean"])) == (1, 9.0) and (int(new["n"]), float(new["mean"])) == (2, 6.0)
    readme = (tmp_path / "out" / "README.md").read_text()
    assert "learning rate x1 or x0.1 the pretraining one" in readme
    # two continual protocols: the main figure holds the latest one's lr, a second one both
    assert "![continual at lr x0.1](perplexity_continual.png)" in readme
    assert "![continual, every protocol](perplexity_continual_all.png)" in readme
    assert (tmp_path / "out" / "perplexity_continual_all.png").stat().st_size > 0
    # the re-run pretrained seed 0 again: a zero-shot repeat of the kept (latest) run, and no
    # continual one (the two continual stages differ)
    repeats = list(csv.DictReader(open(tmp_path / "out" / "repeats.csv")))
    assert {(r["job"], r["stage"]) for r in repeats} == {("rope:0.001:0", "zero-shot")} and len(repeats) == 6
    assert (float(repeats[0]["kept"]), float(repeats[0]["repeat"])) == (10.0, 8.0)
    # a continual-only re-run that read the same pretraining run (its dates) repeats nothing
    jobs[1]["stage_dates"] = jobs[0]["stage_dates"]
    (tmp_path / "1.job.json").write_text(json.dumps(jobs[1]))
    study.aggregate([tmp_path], tmp_path / "out")
    assert not (tmp_path / "out" / "repeats.csv").exists()  # nor a stale file from the first run
    assert "No job was run twice." in (tmp_path / "out" / "repeats.md").read_text()


def test_plot_survives_a_collapsed_seed_and_many_arms_of_one_family(tmp_path):
    """Two shapes the study met: a std wider than the mean (one seed collapsed at 16k, the others
    did not), which a log axis cannot draw down to zero, and 8 arms of one family (the continual
    stage's variants), where the per-arm alpha ran below 0. Both raised inside matplotlib."""
    pytest.importorskip("matplotlib")
    rows = [{"arm": f"tapa-{i}", "family": "tapa", "label": f"TAPA {i}", "length": n,
             "mean": 94.0 if n == 16384 else 9.0, "std": 120.0 if n == 16384 else 0.5, "n": 3}
            for i in range(8) for n in (512, 2048, 16384)]
    path = study.plot_perplexity(rows, tmp_path / "p.png", title="t", train_len=512)
    assert path.stat().st_size > 0


def test_zoom_panel_draws_no_error_bar_for_a_point_above_it(tmp_path, monkeypatch):
    """The zoom shows the arms within 2x the best mean; an arm far above it (69 +- 70 at 16k) keeps
    its line but not its bar, which crossed the whole zoom panel. The full panel keeps every bar."""
    plt = pytest.importorskip("matplotlib.pyplot")
    rows = [{"arm": arm, "family": "tapa", "label": arm, "length": n, "mean": mean, "std": std, "n": 3}
            for arm, mean, std in (("good", 8.0, 0.1), ("bad", 69.0, 70.0)) for n in (512, 16384)]
    drawn = []
    original = plt.Axes.errorbar

    def spy(self, x, y, yerr=None, **kwargs):
        drawn.append((kwargs["label"], [list(side) for side in yerr]))
        return original(self, x, y, yerr=yerr, **kwargs)

    monkeypatch.setattr(plt.Axes, "errorbar", spy)
    study.plot_perplexity(rows, tmp_path / "p.png", title="t", train_len=512)
    full, zoom = drawn[:2], drawn[2:]
    assert dict(full)["bad (n=3)"] == [[0.9 * 69.0] * 2, [70.0] * 2]
    assert dict(zoom)["bad (n=3)"] == [[0.0, 0.0], [0.0, 0.0]]
    assert dict(zoom)["good (n=3)"] == [[0.1, 0.1], [0.1, 0.1]]


def test_theory_table_reads_each_seed_at_the_main_lr():
    """theory_trained.md: per seed, the moments at distance 1 and at the bins nearest 1/128 ...
    1 of the largest distance, and the variance change between the second and the last bin;
    a run at another lr is left out."""
    distances = [0.0, 1.0, 2.0, 26.0, 200.0, 850.0, 3400.0]

    def rows(seed, lr, variances):
        return [{"arm": "tapa", "label": "TAPA", "lr": lr, "seed": seed, "layer": 4, "kind": "tapa",
                 "estimate": "trained", "distance": d, "mean": 1.0 / (1 + d), "var": var}
                for d, var in zip(distances, variances)]

    jobs = [synthetic_job("tapa", "tapa", 1e-3, seed, [10] * 6) for seed in (0, 1)]
    for job in jobs:  # the setup the table names comes from the jobs that ran the theory stage
        job["results"]["theory"] = {"rows": []}
        job["protocol"].update(theory_sequences=3, theory_len=64)
    jobs.append(synthetic_job("tapa", "tapa", 5e-4, 0, [12] * 6))
    table = study.theory_markdown(rows(0, 1e-3, [5, 6, 6, 8, 7, 6, 4]) + rows(1, 1e-3, [5, 6, 6, 10, 9, 8, 8])
                                  + rows(0, 5e-4, [1] * 7), jobs)
    assert "| d=1 | d=26 | d=200 | d=850 | d=3400 |" in table and "3 test sequences of 64 tokens" in table
    assert "| TAPA | 0 | 4 | 0.50 / 6.00 | 0.04 / 8.00 | 0.00 / 7.00 | 0.00 / 6.00 | 0.00 / 4.00 | -50% |" in table
    assert "| TAPA | 1 | 4 |" in table and "-20% |" in table
    assert table.count("| TAPA |") == 2  # the 5e-4 run is not the main lr
    assert "TAPA -35% ± 21% (n=2)" in table
    assert study.theory_markdown([], jobs) == ""


def test_training_curves_plot_the_owner_runs_at_the_main_lr(tmp_path, monkeypatch):
    """training_curves.png: one panel per arm that owns its pretraining run, one line per seed at
    the arm's main lr; an eval-time arm (the same run) and another lr add nothing; no curves, no plot."""
    pytest.importorskip("matplotlib")
    jobs = [synthetic_job("tapa", "tapa", 1e-3, seed, [10] * 6) for seed in (0, 1)]
    jobs.append(synthetic_job("tapa", "tapa", 5e-4, 0, [12] * 6))
    jobs.append(synthetic_job("rope-eval-yarn", "rope", 1e-3, 0, [9] * 6))
    for job in jobs:
        job["group"] = f"tapa-lr{job['lr']:g}-s{job['seed']}" if job["arm"] == "tapa" else "rope-lr0.001-s0"
        job["results"]["pretrain"]["curve"] = {
            "fields": ["step", "loss", "val_loss"],
            "points": [[step, 6.0 / step ** 0.3 + job["seed"] * 0.05, None] for step in range(50, 1001, 50)]}
    assert study.plot_training_curves([], tmp_path / "none.png") is None
    seen = []
    import matplotlib.axes

    real_plot = matplotlib.axes.Axes.plot
    monkeypatch.setattr(matplotlib.axes.Axes, "plot",
                        lambda self, *a, **k: (seen.append(k.get("label")), real_plot(self, *a, **k))[1])
    path = study.plot_training_curves(jobs, tmp_path / "curves.png")
    assert path.stat().st_size > 0
    assert seen == ["seed 0 (val 3.000)", "seed 1 (val 3.000)"]  # the main lr's two seeds only


def test_aggregate_labels_continual_results_by_the_jobs_own_scale(tmp_path):
    """A job that records its arm's own continual lr scale is labelled by it; one that records
    none (older jobs) by its protocol's."""
    old_protocol = {k: v for k, v in arms.TOY_GPU.to_dict().items() if k != "continual_lr_scale"}
    jobs = [
        synthetic_job("rope", "rope", 1e-3, 0, [8] * 6, [9] * 6, label="RoPE", protocol=old_protocol),
        synthetic_job("rope", "rope", 1e-3, 1, [8] * 6, [7] * 6, label="RoPE"),
        synthetic_job("hybrid-tapa-clr03", "hybrid", 1e-3, 0, [8] * 6, [6] * 6, label="TAPA hybrid",
                      continual_lr_scale=0.3),
    ]
    for index, job in enumerate(jobs):
        (tmp_path / f"{index}.job.json").write_text(json.dumps(job))
    study.aggregate([tmp_path], tmp_path / "out")
    labels = {r["label"] for r in csv.DictReader(open(tmp_path / "out" / "perplexity.csv"))
              if r["stage"] == "continual"}
    assert labels == {"RoPE [continual lr x1]", "RoPE [continual lr x0.1]", "TAPA hybrid [continual lr x0.3]"}
    coverage = (tmp_path / "out" / "coverage.md").read_text()
    assert "| continual x1 | continual x0.3 | continual x0.1 |" in coverage
    assert "learning rate x1 or x0.3 or x0.1 the pretraining one" in (tmp_path / "out" / "README.md").read_text()


def test_passkey_depth_plot_needs_two_seeds_and_splits_hybrids(tmp_path, monkeypatch):
    """The depth plot leaves out one-seed arms, and draws hybrids and all-global arms in rows."""
    grid = {"lengths": [2048, 4096], "depths": [0.0, 1.0], "trials": 50, "seeds": 2,
            "accuracy": [[0.5, 1.0], [0.0, 1.0]], "std": [[0.1, 0.0], [0.0, 0.0]]}
    grids = {"tapa": {**grid, "label": "TAPA", "family": "tapa"},
             "hybrid-tapa": {**grid, "label": "TAPA hybrid", "family": "hybrid"},
             "nope": {**grid, "label": "NoPE", "family": "nope", "seeds": 1}}
    import matplotlib.pyplot as plt

    drawn = {}
    real = plt.subplots

    def spy(rows, cols, **kwargs):
        fig, axes = real(rows, cols, **kwargs)
        drawn["axes"] = axes
        return fig, axes

    monkeypatch.setattr(plt, "subplots", spy)
    assert study.plot_passkey_depths(grids, tmp_path / "d.png").stat().st_size > 0
    axes = drawn["axes"]
    assert axes.shape == (2, 2)  # two rows (all-global, hybrids) x two lengths
    labels = [[text.get_label() for text in ax.containers] for ax in axes[:, 0]]
    assert labels == [["TAPA (n=2)"], ["TAPA hybrid (n=2)"]]  # NoPE (1 seed) left out
    assert study.plot_passkey_depths({"nope": grids["nope"]}, tmp_path / "e.png") is None


def test_readme_title_names_a_protocol_other_than_the_toy_one(tmp_path):
    """The scale step aggregates into its own folder: its README says which protocol it holds."""
    job = synthetic_job("tapa", "tapa", 1e-3, 0, [7] * 6, protocol=arms.SCALE_768.to_dict())
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.job.json").write_text(json.dumps(job))
    study.aggregate([tmp_path / "in"], tmp_path / "out")
    readme = (tmp_path / "out" / "README.md").read_text()
    assert readme.startswith("# Reproduction study (issue 11), protocol `scale-768`\n")
    assert "- The plan's learning rates: 0.0005, 0.001, 0.002" in readme


def test_compare_takes_the_base_continual_stage_of_the_same_protocol(tmp_path):
    """`compare`: each arm of the scale protocol next to the toy protocol's (mean over its seeds),
    both gaps to the anchor in their own protocol, and only the base's continual jobs whose
    continual protocol is the compared one's (a x1 continual stage of the base is left out)."""
    toy, scale = arms.TOY_GPU.to_dict(), arms.SCALE_768.to_dict()
    base = [synthetic_job("rope-yarn", "rope", 1e-3, s, [8] * 6, [10] * 6, protocol=toy,
                          continual_lr_scale=0.1) for s in (0, 1)]
    base += [synthetic_job("hybrid-tapa", "hybrid", 1e-3, s, [9] * 6, [v] * 6, protocol=toy,
                           continual_lr_scale=0.1) for s, v in ((0, 11.0), (1, 12.0))]
    base.append(synthetic_job("hybrid-tapa", "hybrid", 1e-3, 2, [9] * 6, [50] * 6, protocol=toy,
                              continual_lr_scale=1.0))  # another continual protocol: not compared
    other = [synthetic_job("rope-yarn", "rope", 1e-3, 0, [7] * 6, [8] * 6, protocol=scale,
                           continual_lr_scale=0.1),
             synthetic_job("hybrid-tapa", "hybrid", 1e-3, 0, [7] * 6, [8.4] * 6, protocol=scale,
                           continual_lr_scale=0.1)]
    for name, jobs in (("base", base), ("other", other)):
        (tmp_path / name).mkdir()
        for index, job in enumerate(jobs):
            (tmp_path / name / f"{index}.job.json").write_text(json.dumps(job))
    written = study.compare([tmp_path / "base"], [tmp_path / "other"], tmp_path / "out")
    assert [p.name for p in written] == ["vs_toy-gpu.md", "vs_toy-gpu.csv", "vs_toy-gpu.png"]
    rows = list(csv.DictReader(open(tmp_path / "out" / "vs_toy-gpu.csv")))
    hybrid = [r for r in rows if r["arm"] == "hybrid-tapa" and r["stage"] == "continual"]
    assert len(hybrid) == 6 and all(r["base_n"] == "2" for r in hybrid)
    assert math.isclose(float(hybrid[0]["base_mean"]), 11.5) and math.isclose(float(hybrid[0]["other_mean"]), 8.4)
    assert math.isclose(float(hybrid[0]["base_gap"]), 0.15) and math.isclose(float(hybrid[0]["other_gap"]), 0.05)
    text = (tmp_path / "out" / "vs_toy-gpu.md").read_text()
    assert "| hybrid-tapa | +15.0% → +5.0% |" in text
    assert "| rope-yarn | +0.0%" not in text  # the anchor has no gap row
    # zero-shot: these synthetic anchor jobs have a zero-shot stage too, so that stage has gaps
    zero = [r for r in rows if r["arm"] == "hybrid-tapa" and r["stage"] == "zero-shot"]
    assert math.isclose(float(zero[0]["base_gap"]), 9 / 8 - 1) and math.isclose(float(zero[0]["other_gap"]), 0.0)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no job JSONs"):
        study.compare([tmp_path / "base"], [tmp_path / "empty"], tmp_path / "out")
    with pytest.raises(ValueError, match="does not exist"):
        study.compare([tmp_path / "base"], [tmp_path / "missing"], tmp_path / "out")
    assert study.main(["compare", "--base", str(tmp_path / "base"), "--other", str(tmp_path / "other"),
                       "--out", str(tmp_path / "cli")]) == 0
    assert "--anchor rope-yarn" in (tmp_path / "cli" / "vs_toy-gpu.md").read_text()


def test_dry_run_deals_batches_to_gpus(capsys):
    """--gpus N prints multi-GPU calls (scripts/gpu_study.sh xN), one batch a GPU: every job once,
    no call with more lanes than GPUs, and no --time-budget (the script sets each runner's)."""
    argv = ["--protocol", "toy-gpu-screen", "--plan", "seeds", "--families", "hybrid", "--lr",
            "hybrid=1e-3", "--seeds", "0", "--dry-run", "--split-batches", "540"]
    assert run.main(argv) == 0
    single = [line for line in capsys.readouterr().out.splitlines() if line.startswith("scripts/")]
    assert run.main(argv + ["--gpus", "4"]) == 0
    calls = [line for line in capsys.readouterr().out.splitlines() if "gpu_study.sh x" in line]
    assert len(calls) == -(-len(single) // 4)
    lanes = []
    for line in calls:
        words = line.split()
        gpus = int(words[2][1:])
        assert words[1] == "scripts/gpu_study.sh" and 1 <= gpus <= 4 and "--time-budget" not in line
        lanes += words[3:3 + gpus]
        assert words[3 + gpus].startswith("--")
    # the same batches as one GPU's plan, dealt out
    assert lanes == [line.split()[3] for line in single]
    assert plan.gpu_lanes([[1], [2], [3]], 2) == [[[1], [2]], [[3]]]
    with pytest.raises(ValueError):
        plan.gpu_lanes([], 0)
