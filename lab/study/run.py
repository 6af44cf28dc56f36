"""Run batches of the toy study (issue 11) on one GPU inside a time budget, and pack the results.

    python3 -m lab.study.run --jobs rope:1e-3:0,tapa:1e-3:0 --concurrent 1 --time-budget 540 \
        --root /tmp/study --out $OUT
    python3 -m lab.study.run --plan lr-sweep --families rope,nope,tapa,hybrid --dry-run \
        --split-batches 540                         # the device calls the sweep needs
    python3 -m lab.study.run --plan seeds --lr rope=1e-3,nope=1e-3,tapa=1e-3,hybrid=1e-3 ...

What a call does:
1. Checks every command's flags against this checkout's `tapa` (before any GPU time is spent).
2. Builds the corpus once (`tapa train ... --data-only`, cached under --root/cache).
3. Runs up to --concurrent groups at once (a group: the jobs that share one pretraining run,
   see plan.py), each in its own worker process that runs the group's `tapa train` / `tapa eval`
   commands one after another. A group starts only if its estimated time fits in what is left
   of --time-budget (with --allow-partial, whenever a minute is left); inside a group, an
   evaluation stage starts only if it should finish before the budget (StagePace: an evaluation
   stopped at the budget is lost whole, a training stage resumes from its checkpoint); at the
   budget, running groups are stopped. Finished stages leave a marker,
   so on a machine that still holds --root a later call skips them and resumes an interrupted
   training run from its last checkpoint. A fresh machine starts over: everything the study
   needs later is in the archive.
4. Prints a progress line every --progress-every seconds (stage, step, tokens/s, loss).
5. Writes one JSON per job (summarize.py) and packs them, the logs, the batch record and the
   tokenizer into ONE tar.gz under --out.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import importlib
import json
import math
import os
import platform
import shlex
import shutil
import subprocess
import sys
import time
import traceback
import warnings
from dataclasses import dataclass
from pathlib import Path

from lab.study import domain, preflight
from lab.study.aggregate import load_jobs
from lab.study.arms import (ARMS, DOMAIN_STAGES, FAMILIES, PROTOCOLS, STAGES, TINY_ESTIMATES,
                            Estimates, stages_of)
from lab.study.code_tree import tree_id
from lab.study.plan import (Group, Stage, build_groups, check_flags, domain_dir, estimate_stage,
                            gpu_lanes, parse_jobs, job_stages, parse_lr_map, plan_jobs,
                            pretrain_owner, split_batches, stage_closure)
from lab.study.summarize import (corpus_summary, done_marker, finished_stages, job_summary, pack,
                                 read_json, write_json_atomic)
from tapa.train.rundir import read_metrics

# the repository root: workers run `python3 -m lab.study.run` with it on their PYTHONPATH
REPO = Path(__file__).resolve().parents[2]


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _csv_list(cast):
    def parse(text):
        return [cast(v) for v in text.split(",") if v.strip()]
    return parse


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    what = parser.add_argument_group("what to run")
    what.add_argument("--jobs", help="arm:lr:seed,... (arms: lab/study/arms.py)")
    what.add_argument("--plan", choices=("lr-sweep", "seeds"), help="generate the jobs instead")
    what.add_argument("--families", type=_csv_list(str), default=list(FAMILIES))
    what.add_argument("--arms", type=_csv_list(str), default=None, help="restrict a plan to these arms")
    what.add_argument("--lr", default=None, help="--plan seeds: family=lr,... (the sweep's best); an arm=lr entry overrides its family's")
    what.add_argument("--seeds", type=_csv_list(int), default=None)
    what.add_argument("--stages", type=_csv_list(str), default=None,
                      help=f"subset of {','.join(STAGES)} (default: all; lr-sweep: pretrain,eval0)")
    what.add_argument("--protocol", choices=sorted(PROTOCOLS), default="toy-gpu")
    what.add_argument("--pretrain-steps", type=int, default=None,
                      help="override the protocol's (recorded; such jobs are not protocol jobs)")
    what.add_argument("--train-flags", default="", help="extra flags for every tapa train, e.g. '--compile'")
    what.add_argument("--skip-done", type=Path, default=None, metavar="DIR",
                      help="leave out the jobs whose complete JSON of this protocol is in DIR "
                           "(e.g. the toy study's jobs/: results/toy-study/README.md says where they are), so a "
                           "plan runs only what is missing")
    how = parser.add_argument_group("how")
    how.add_argument("--root", type=Path, default=Path("/tmp/study"), help="runs, caches, logs")
    how.add_argument("--out", type=Path, default=None, help="where the archive goes (default ROOT/out)")
    how.add_argument("--concurrent", type=int, default=1,
                     help="groups (processes) at once on the GPU (sharing it buys no throughput: arms.Estimates)")
    how.add_argument("--time-budget", type=float, default=None, help="seconds for the whole call")
    how.add_argument("--pack-reserve", type=float, default=15.0, help="seconds kept for packing")
    how.add_argument("--allow-partial", action="store_true",
                     help="start groups that cannot finish inside the budget: the next call on the "
                          "same (still warm) machine resumes them from their checkpoints")
    how.add_argument("--progress-every", type=float, default=30.0)
    how.add_argument("--est-tokens-per-s", type=float, default=None,
                     help="one training process alone (default: arms.Estimates)")
    how.add_argument("--est-speedup", type=float, default=None,
                     help="total throughput of --concurrent processes over one alone (default: "
                          "arms.Estimates, a guess until measured)")
    how.add_argument("--dry-run", action="store_true", help="print groups, commands and estimates")
    how.add_argument("--split-batches", type=float, default=None, metavar="SECONDS",
                     help="with --dry-run: pack the groups into device calls of this budget")
    how.add_argument("--calls-per-batch", type=int, default=1,
                     help="with --split-batches: back-to-back calls on one warm machine per batch")
    how.add_argument("--gpus", type=int, default=1,
                     help="with --split-batches: GPUs a call has; each runs one batch (a runner a "
                          "GPU: scripts/gpu_study.sh xN)")
    how.add_argument("--worker", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is None and bool(args.jobs) == bool(args.plan):
        parser.error("give exactly one of --jobs and --plan")
    if args.concurrent < 1:
        parser.error("--concurrent must be >= 1")
    if args.gpus < 1:
        parser.error("--gpus must be >= 1")
    return args


def configure(args):
    """(protocol, estimates, jobs, stages) the arguments ask for."""
    protocol = PROTOCOLS[args.protocol]
    if args.pretrain_steps:
        protocol = dataclasses.replace(protocol, name=f"{protocol.name}-steps{args.pretrain_steps}",
                                       pretrain_steps=args.pretrain_steps)
    # A bigger model is slower per token in every stage that runs it, evaluations included
    # (Estimates.MODEL_TIMES)
    base = TINY_ESTIMATES if protocol.device == "cpu" else Estimates()
    estimates = base.for_model_rate(protocol.rate_scale)
    if args.est_tokens_per_s:
        estimates.tokens_per_s = args.est_tokens_per_s
    if args.est_speedup:
        estimates.speedup = {**estimates.speedup, args.concurrent: args.est_speedup}
    if args.jobs:
        jobs = parse_jobs(args.jobs)
    else:
        jobs = plan_jobs(args.plan, protocol, families=args.families, arms=args.arms,
                         lrs=parse_lr_map(args.lr), seeds=args.seeds)
    default = ["pretrain", "eval0"] if args.plan == "lr-sweep" else stages_of(protocol)
    if not protocol.domain and set(args.stages or ()) & set(DOMAIN_STAGES):
        raise SystemExit(f"--stages {','.join(DOMAIN_STAGES)}: protocol {protocol.name} has no "
                         f"second domain")
    stages = stage_closure(args.stages or default)
    if args.skip_done:
        done = done_jobs(args.skip_done, protocol.fingerprint(), stages)
        skipped = [job for job in jobs if job.id in done]
        jobs = [job for job in jobs if job.id not in done]
        # a job left to run that trains its group's pretraining again: the done owner of that
        # pretraining rides along, so the rerun is also measured as a repeat of the owner
        rerun = {(pretrain_owner(ARMS[j.arm]), j.lr, j.seed) for j in jobs}  # stages hold pretrain
        again = [job for job in skipped if (job.arm, job.lr, job.seed) in rerun]
        jobs = again + jobs
        if skipped:
            print(f"skipping {len(skipped) - len(again)} job(s) done in {args.skip_done}: "
                  f"{', '.join(j.id for j in skipped if j not in again)}")
        if again:
            print(f"running {len(again)} done job(s) again with a pretraining they share (a repeat): "
                  f"{', '.join(j.id for j in again)}")
    return protocol, estimates, jobs, stages


def done_jobs(folder: Path, protocol_id: str, stages) -> set[str]:
    """Ids (arm:lr:seed) of the job JSONs in folder (read as the aggregate reads them, ids by
    today's fingerprint rule) that are complete under this protocol's full id and ran every stage
    the job would run if asked for these stages now (an eval-time arm has no theory stage of its
    own, so it is done without one)."""
    if not folder.is_dir():
        raise SystemExit(f"--skip-done: no folder {folder}")
    if not any(folder.rglob("*.job.json")):
        return set()
    done = set()
    for job in load_jobs([folder]):
        if not job["complete"] or job["protocol_id"] != protocol_id:
            continue
        try:
            (planned,) = parse_jobs(job["job"])
        except ValueError:  # an arm no longer defined: not a job this plan can skip
            continue
        if set(job_stages(planned, stages)) <= set(job["stages_done"]):
            done.add(job["job"])
    return done


# ---------------------------------------------------------------------------------------------
# the worker: one group's stages, in this process, one after another

TRAIN_KINDS = ("pretrain", "continual")  # stages that checkpoint, so a stopped one resumes

class StagePace:
    """The worker's guard at a call's end: will an evaluation stage finish before the deadline?

    Training stages always start (they checkpoint, and the next call resumes them); an evaluation
    stage starts only if its expected time fits in what is left. Expected: the runner's own
    estimate given the rates this call measured (observed_rates, from the stages' done markers);
    for a kind not measured yet, the estimate times the slowest ratio of measured to estimated
    time among the evaluations this call finished (a GPU slower than the estimates shows there
    first), never below the estimate."""

    def __init__(self, spec: dict, root: Path):
        self.deadline = spec.get("deadline_unix")
        est = dict(spec.get("estimates") or {})
        if est:  # JSON made the speedup table's keys strings
            est["speedup"] = {int(k): v for k, v in est.get("speedup", {}).items()}
        self.estimates = Estimates(**est) if est else None
        self.level = spec.get("level", 1)
        self.root, self.call = root, spec.get("call")
        self.group = Group(spec["group"], [], [Stage(**stage) for stage in spec["stages"]])

    def expected(self, stage: dict) -> float:
        rates = observed_rates(self.root, [self.group], self.call)
        estimate = lambda s, observed=None: estimate_stage(s, self.estimates, self.level, observed)  # noqa: E731
        stage = Stage(**stage)
        if stage.kind in rates:
            return estimate(stage, rates)
        ratios = [estimate(s, rates) / estimate(s) for s in self.group.stages
                  if s.kind in rates and s.kind not in TRAIN_KINDS]
        return estimate(stage) * max([1.0, *ratios])

    def too_late(self, stage: dict) -> str | None:
        """Why the stage should not start now, or None."""
        if self.deadline is None or self.estimates is None or stage["kind"] in TRAIN_KINDS:
            return None
        need, left = self.expected(stage), self.deadline - time.time()
        return f"needs ~{need:.0f} s, {max(left, 0):.0f} s left" if need > left else None


def run_worker(spec_path: Path) -> int:
    spec = json.loads(spec_path.read_text())
    root, gid = Path(spec["root"]), spec["group"]
    import torch
    import torch._dynamo

    # Every stage of the group runs in this process: training, evaluations at 6 lengths (twice),
    # theory, passkey. A hybrid's local layers compile FlexAttention once per input shape, and past
    # dynamo's default recompile limit (8) tapa.ops.local sends new shapes to its slower
    # chunked path: give this process room for the job's ~20 fixed shapes.
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, max(64, getattr(torch._dynamo.config, name)))

    from tapa.cli import main as tapa_main
    from tapa.eval.evaluate import hardware_description
    from tapa.train.saving import has_checkpoint

    device = "cuda" if spec["device"] == "cuda" and torch.cuda.is_available() else "cpu"
    hardware = hardware_description(device)
    kernels = preflight.kernel_defaults()
    failed, deferred, status = set(), set(), 0
    finished = finished_stages(root, gid, spec["stages"])
    pace = StagePace(spec, root)
    for stage in spec["stages"]:
        name, out, marker = stage["name"], Path(stage["out"]), done_marker(root, gid, stage["name"])
        if name in finished:
            print(f"== {name}: done in an earlier call", flush=True)
            continue
        if any(need in deferred for need in stage["needs"]):
            print(f"== {name}: left for the next call with what it needs", flush=True)
            deferred.add(name)
            continue
        if any(need in failed or not done_marker(root, gid, need).is_file() for need in stage["needs"]):
            print(f"== {name}: not run, it needs {stage['needs']}", flush=True)
            failed.add(name)
            continue
        late = pace.too_late(stage)
        if late:
            # an evaluation stopped at the budget is lost whole; left for the next call, it costs
            # nothing now, and the call ends sooner (device time is counted while the machine is held)
            print(f"== {name}: left for the next call: {late}", flush=True)
            deferred.add(name)
            continue
        argv = list(stage["argv"])
        if marker.is_file():  # stale: finished with other flags, or it read a stage run again
            print(f"== {name}: done in an earlier call with other flags or inputs; running it again",
                  flush=True)
            marker.unlink()
            shutil.rmtree(out, ignore_errors=True)  # never resume a run trained with other flags
        if stage["kind"] in ("pretrain", "continual") and (out / "config.json").is_file():
            if has_checkpoint(out):
                argv.append("--resume")  # an earlier call stopped it: continue from its checkpoint
            else:
                shutil.rmtree(out)
        elif out.exists():
            shutil.rmtree(out)  # a partial evaluation
        write_json_atomic(root / "runs" / gid / "status.json", {"stage": name, "started": time.time()})
        started, clock = _now(), time.perf_counter()
        module = argv[1] if argv[0] == "-m" else None
        print(f"== {name} ({started}): {'python3' if module else 'tapa'} {shlex.join(argv)}", flush=True)
        sys.argv = [module or "tapa", *(argv[2:] if module else argv)]  # tapa eval records sys.argv
        try:
            rc = importlib.import_module(module).main(argv[2:]) if module else tapa_main(argv)
        except SystemExit as stop:
            rc = stop.code if isinstance(stop.code, int) else 1
            if not isinstance(stop.code, int):
                print(stop.code, flush=True)
        except Exception:  # noqa: BLE001 - the log shows it; the group goes on where it can
            traceback.print_exc()
            rc = 1
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()  # give the memory back to the other workers
        if rc == 0:
            marker.parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic(marker, {"stage": name, "argv": argv, "wall_s": time.perf_counter() - clock,
                                       "started": started, "finished": _now(), "hardware": hardware,
                                       "kernels": kernels, "call": spec["call"]})
        else:
            print(f"== {name}: FAILED (rc {rc})", flush=True)
            failed.add(name)
            status = 1
    return status


# ---------------------------------------------------------------------------------------------
# the parent: data, scheduling, progress, packing

@dataclass
class Running:
    group: Group
    process: subprocess.Popen
    started: float
    estimate: float


def build_data(protocol, cache_dir: Path, log) -> tuple[dict, list]:
    """Build (or find) the corpus every job reads; (corpus summary, the command)."""
    from tapa.cli import main as tapa_main
    from tapa.data import build_corpus
    from tapa.train import command as train_command

    argv = ["train", "--recipe", protocol.recipe, *protocol.data, "--cache-dir", str(cache_dir),
            *protocol.model, "--data-only", "--no-progress"]
    log(f"data: tapa {shlex.join(argv)}")
    clock = time.perf_counter()
    tapa_main(argv)
    parser = argparse.ArgumentParser()
    train_command.add_arguments(parser)
    _, _, data_cfg = train_command.configs_from_args(parser.parse_args(argv[1:]))
    corpus = build_corpus(data_cfg, progress=False)
    summary = corpus_summary(corpus.manifest, str(corpus.directory))
    summary["seconds_this_call"] = time.perf_counter() - clock
    summary["tokenizer_file"] = str(corpus.tokenizer_dir / "tokenizer.json")
    summary["manifest_file"] = str(corpus.directory / "manifest.json")
    return summary, argv


def build_domain(protocol, root: Path, log) -> dict:
    """Build the protocol's second domain where the domain stages read it; its manifest."""
    if protocol.domain != domain.NAME:
        raise SystemExit(f"protocol {protocol.name}: unknown domain {protocol.domain!r} "
                         f"(lab.study.domain builds {domain.NAME!r})")
    manifest = domain.build(domain_dir(root, protocol))
    log(f"domain {manifest['domain']}: {manifest['files']} files, {manifest['bytes']:,} bytes, "
        f"sha256 {manifest['sha256'][:12]}")
    return {k: v for k, v in manifest.items() if k != "names"}  # the job JSONs carry the summary


def observed_rates(root: Path, groups: list[Group], call: str) -> dict:
    """Seconds per training token and per evaluated method, from stages finished in this call
    (the slowest seen: a conservative guide for what still has to start)."""
    rates = {}
    for group in groups:
        for stage in group.stages:
            marker = read_json(done_marker(root, group.id, stage.name))
            if not marker or marker.get("call") != call or "--resume" in marker["argv"]:
                continue  # a resumed stage did only part of its work in this call
            units = stage.tokens if stage.kind in ("pretrain", "continual") else stage.methods
            rates[stage.kind] = max(rates.get(stage.kind, 0.0), marker["wall_s"] / units)
    return rates


def progress_line(root: Path, running: dict, protocol, elapsed: float, counts: str) -> str:
    parts, total = [], 0.0
    for gid, item in running.items():
        status = read_json(root / "runs" / gid / "status.json") or {}
        stage = item.group.stage(status.get("stage", ""))
        if stage is None:
            parts.append(f"{gid}: starting")
            continue
        text = f"{gid}: {stage.name}"
        metrics = Path(stage.out) / "metrics.jsonl"
        if stage.kind in ("pretrain", "continual") and metrics.is_file():
            with warnings.catch_warnings():  # the trainer may be writing the last line right now
                warnings.simplefilter("ignore")
                records = read_metrics(metrics)
            if records:
                last = records[-1]
                steps = protocol.pretrain_steps if stage.kind == "pretrain" else protocol.continual_steps
                total += last["tokens_per_s"]
                text += (f" {last['step']}/{steps} {last['tokens_per_s'] / 1e3:.0f}k tok/s "
                         f"loss {last['loss']:.3f}")
        parts.append(text)
    return (f"[{elapsed:6.0f}s] {counts} | " + " | ".join(parts)
            + (f" | total {total / 1e3:.0f}k tok/s" if total else ""))


def trained_fraction(stage) -> float:
    """The share of a training stage an earlier, stopped call already did (its last checkpoint)."""
    latest = Path(stage.out) / "checkpoints" / "latest"
    if stage.kind not in ("pretrain", "continual") or not latest.is_file():
        return 0.0
    state = read_json(latest.parent / latest.read_text().strip() / "state.json") or {}
    done = int(state.get("tokens", 0))
    return min(done / stage.tokens, 1.0) if stage.tokens else 0.0


def group_state(root: Path, group: Group) -> str:
    done = finished_stages(root, group.id, group.stages)
    return "done" if len(done) == len(group.stages) else f"{len(done)}/{len(group.stages)} stages"


def schedule(args, protocol, estimates, groups, call, log, started: float) -> dict:
    """Run the groups inside the budget, counted from `started` (perf_counter at the call's start,
    so the data build counts too); {group id: what happened}."""
    root = args.root
    deadline = (args.time_budget - args.pack_reserve) if args.time_budget else float("inf")
    logs = root / "logs"
    # the cores this runner may use: all of them, or its share when several runners (one a GPU,
    # scripts/gpu_study.sh xN) run side by side
    cpus = int(os.environ.get("STUDY_CPUS") or os.cpu_count() or 1)
    env = dict(os.environ, PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false",
               OMP_NUM_THREADS=str(max(1, cpus // args.concurrent)))
    import tapa
    env["PYTHONPATH"] = os.pathsep.join([str(Path(tapa.__file__).resolve().parents[1]), str(REPO),
                                        env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    outcome, running, next_progress = {}, {}, args.progress_every

    level = min(args.concurrent, len(groups))  # processes sharing the GPU at most

    def pending_cost(group, rates):
        finished = finished_stages(root, group.id, group.stages)
        return sum(estimate_stage(s, estimates, level, rates) * (1 - trained_fraction(s))
                   for s in group.stages if s.name not in finished)

    # groups an earlier call left half-trained first (their checkpoints are here), then longest first
    pending = sorted(groups, key=lambda g: (not any(trained_fraction(s) for s in g.stages),
                                            -pending_cost(g, {})))
    while pending or running:
        elapsed = time.perf_counter() - started
        for gid, item in list(running.items()):
            if item.process.poll() is not None:
                state = group_state(root, item.group)
                outcome[gid] = {"state": state, "rc": item.process.returncode,
                                "seconds": time.perf_counter() - item.started,
                                "estimate_s": item.estimate}
                log(f"[{elapsed:6.0f}s] {gid}: {state} (rc {item.process.returncode}) in "
                    f"{outcome[gid]['seconds']:.0f} s (estimated {item.estimate:.0f} s)")
                del running[gid]
        rates = observed_rates(root, groups, call)
        for group in list(pending):
            if len(running) >= args.concurrent:
                break
            cost = pending_cost(group, rates)
            pending.remove(group)
            if cost == 0:
                outcome[group.id] = {"state": "done", "note": "all stages done in earlier calls"}
                continue
            partial = args.allow_partial and deadline - elapsed > 60
            if elapsed + cost > deadline and not partial:
                outcome[group.id] = {"state": "not started", "estimate_s": cost,
                                     "note": f"would end at {elapsed + cost:.0f} s, budget {deadline:.0f} s"}
                log(f"[{elapsed:6.0f}s] {group.id}: not started (needs ~{cost:.0f} s, "
                    f"{max(deadline - elapsed, 0):.0f} s left)")
                continue
            spec = root / "runs" / group.id / "worker.json"
            spec.parent.mkdir(parents=True, exist_ok=True)
            (spec.parent / "status.json").unlink(missing_ok=True)  # an earlier call's
            spec.write_text(json.dumps({
                "root": str(root), "group": group.id, "call": call, "device": protocol.device,
                "stages": [vars(s) for s in group.stages],
                # the worker starts no evaluation it cannot finish by then (StagePace)
                "deadline_unix": time.time() + (deadline - elapsed) if math.isfinite(deadline) else None,
                "estimates": vars(estimates), "level": level}, indent=1))
            with open(logs / f"{group.id}.log", "a") as handle:
                handle.write(f"\n##### call {call}\n")
                handle.flush()
                # same process session as the runner: if the device call ends the runner, the
                # machine's clean-up ends the workers too
                process = subprocess.Popen([sys.executable, "-m", "lab.study.run", "--worker", str(spec)],
                                           stdout=handle, stderr=subprocess.STDOUT, env=env)
            running[group.id] = Running(group, process, time.perf_counter(), cost)
            log(f"[{elapsed:6.0f}s] {group.id}: started ({len(group.jobs)} jobs, "
                f"{len(group.stages)} stages, ~{cost:.0f} s)")
        if running and elapsed >= deadline:
            for item in running.values():
                item.process.terminate()
            time.sleep(5)
            for gid, item in running.items():
                if item.process.poll() is None:
                    item.process.kill()
                item.process.wait()
                outcome[gid] = {"state": f"stopped at the budget, {group_state(root, item.group)}",
                                "seconds": time.perf_counter() - item.started, "estimate_s": item.estimate}
                log(f"[{elapsed:6.0f}s] {gid}: stopped at the budget ({group_state(root, item.group)})")
            running.clear()
            for group in pending:
                outcome[group.id] = {"state": "not started", "note": "budget"}
            pending = []
        if running and args.progress_every and elapsed >= next_progress:
            counts = f"running {len(running)}, finished {len(outcome)}/{len(groups)}"
            log(progress_line(root, running, protocol, elapsed, counts))
            next_progress = elapsed + args.progress_every
        if running:
            time.sleep(0.5)
    return outcome


def main(argv=None) -> int:
    clock = time.perf_counter()  # the budget counts from here: imports and the data build too
    args = parse_args(argv)
    if args.worker is not None:
        return run_worker(args.worker)
    protocol, estimates, jobs, stages = configure(args)
    root = args.root.resolve()
    args.root = root
    groups = build_groups(jobs, protocol, stages, root, train_extra=shlex.split(args.train_flags))
    problems = check_flags(groups)
    if args.dry_run:
        return dry_run(args, protocol, estimates, groups, problems)
    if problems:
        print("the commands do not fit this checkout's tapa or the study's layouts:\n  " + "\n  ".join(problems))
        return 2
    # unique per runner: runners for other GPUs may share --root and start in the same second
    call = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}"
    (root / "logs").mkdir(parents=True, exist_ok=True)
    os.environ["TAPA_CACHE"] = str(root / "cache")
    os.environ.setdefault("TRITON_CACHE_DIR", str(root / "cache" / "triton"))
    run_log = open(root / "logs" / f"runner-{call}.log", "w")

    def log(line: str) -> None:
        print(line, flush=True)
        run_log.write(line + "\n")
        run_log.flush()

    log(f"study call {call}: {len(jobs)} jobs in {len(groups)} groups, stages {','.join(stages)}, "
        f"protocol {protocol.name} ({protocol.fingerprint()}), concurrent {args.concurrent}, "
        f"budget {args.time_budget or 'none'} s")
    corpus, data_argv = build_data(protocol, root / "cache" / "data", log)
    log(f"data: {corpus['train_tokens']:,} train tokens ({corpus['seconds_this_call']:.0f} s); "
        f"pretraining reads {protocol.pretrain_tokens:,} = "
        f"{protocol.pretrain_tokens / corpus['train_tokens']:.2f} passes")
    if protocol.domain and set(stages) & set(DOMAIN_STAGES):
        corpus["domain"] = build_domain(protocol, root, log)
    if corpus["train_tokens"] < protocol.pretrain_tokens:
        log("WARNING: the corpus holds fewer tokens than one pretraining run reads; the protocol "
            "asks for one pass (raise --max-train-bytes in arms.py)")
    if protocol.device == "cuda" and preflight.main(log) != 0:  # inside the budget: it counts
        log("preflight FAILED: the fused kernels miss the accuracy bar on this GPU; no group starts")
        outcome = {g.id: {"state": "not started", "note": "preflight failed"} for g in groups}
    else:
        outcome = schedule(args, protocol, estimates, groups, call, log, started=clock)
    context = {"runner": {"command": "python3 -m lab.study.run " + shlex.join(sys.argv[1:] if argv is None else argv),
                          "call": call, "concurrent": args.concurrent, "time_budget": args.time_budget,
                          "python": platform.python_version()},
               "data_command": "tapa " + shlex.join(data_argv), "corpus": corpus, "date": _now(),
               "code": {"src_tree": tree_id(REPO / "src" / "tapa")}}  # which code ran: lab.study.code_tree
    files = {}
    for group in groups:
        for job in group.jobs:
            summary = job_summary(job, group, stages, protocol, root, context)
            if summary["stages_done"]:
                path = root / "jobs" / f"{job.slug}.job.json"
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps(summary, indent=1))
                files[f"jobs/{path.name}"] = path
        files[f"logs/{group.id}.log"] = root / "logs" / f"{group.id}.log"
    batch = {"kind": "tapa-study-batch", "call": call, "started": context["runner"], "date": _now(),
             "seconds": time.perf_counter() - clock, "protocol": protocol.to_dict(),
             "jobs": [j.id for j in jobs], "stages": stages, "groups": outcome,
             "data_seconds": corpus["seconds_this_call"], "observed_s_per_unit":
             observed_rates(root, groups, call), "estimates": vars(estimates)}
    (root / "logs" / f"batch-{call}.json").write_text(json.dumps(batch, indent=1))
    files.update({"batch.json": root / "logs" / f"batch-{call}.json",
                  f"logs/runner-{call}.log": root / "logs" / f"runner-{call}.log",
                  "corpus/tokenizer.json": Path(corpus["tokenizer_file"]),
                  "corpus/manifest.json": Path(corpus["manifest_file"])})
    out = (args.out or root / "out").resolve()
    run_log.close()
    archive = pack(out, f"study-{protocol.name}-{call}.tar.gz", files)
    shutil.copy(root / "logs" / f"batch-{call}.json", out / "batch.json")
    finished = sum(1 for name in files if name.startswith("jobs/"))
    print(f"wrote {archive} ({archive.stat().st_size / 1e3:.0f} kB): {finished} job JSONs; "
          f"{time.perf_counter() - clock:.0f} s in all")
    return 0 if all(o["state"] == "done" for o in outcome.values()) else 1


def dry_run(args, protocol, estimates, groups, problems) -> int:
    total = 0.0
    for group in groups:
        cost = sum(estimate_stage(s, estimates, args.concurrent) for s in group.stages)
        total += cost
        print(f"# {group.id}: jobs {','.join(j.id for j in group.jobs)}; ~{cost:.0f} s at "
              f"{args.concurrent} concurrent")
        for stage in group.stages:
            print(f"  [{stage.name}] {stage.command()}")
    print(f"\n{len(groups)} groups, ~{total:.0f} process-seconds; estimates: {vars(estimates)}")
    if problems:
        print("\nNOT RUNNABLE with this checkout:\n  " + "\n  ".join(problems))
    if args.split_batches:
        calls = args.calls_per_batch
        batches = split_batches(groups, estimates, args.concurrent, args.split_batches,
                                args.pack_reserve, calls)
        passthrough = [f"--protocol {protocol.name}", f"--concurrent {args.concurrent}",
                       f"--time-budget {args.split_batches:.0f}"]
        if args.stages or args.plan == "lr-sweep":
            passthrough.append(f"--stages {','.join(stage_closure(args.stages or ['pretrain', 'eval0']))}")
        if args.pretrain_steps:
            passthrough.append(f"--pretrain-steps {args.pretrain_steps}")
        if args.train_flags:
            passthrough.append(f"--train-flags {shlex.quote(args.train_flags)}")
        for flag in ("est_tokens_per_s", "est_speedup"):
            if getattr(args, flag):
                passthrough.append(f"--{flag.replace('_', '-')} {getattr(args, flag):g}")
        lanes = gpu_lanes(batches, args.gpus)
        if args.gpus == 1:
            print(f"\n{len(batches)} batches of {calls} back-to-back device call(s) of "
                  f"{args.split_batches:.0f} s, {args.concurrent} processes at once"
                  + (" (calls after the first find the warm machine's runs and resume them)" if calls > 1 else ""))
        else:  # a runner a GPU, each with one batch; the script sets each runner's budget itself
            passthrough = [p for p in passthrough if not p.startswith("--time-budget")]
            print(f"\n{len(batches)} batches on {args.gpus} GPUs: {len(lanes)} multi-GPU call group(s) of "
                  f"{calls} back-to-back call(s), each GPU one batch ({args.concurrent} processes at once)")
        for number, lane in enumerate(lanes, 1):
            jobs = [",".join(j.id for g in batch for j in g.jobs) for batch in lane]
            if args.gpus == 1:
                print(f"# batch {number}: {len(lane[0])} groups")
                command = f"scripts/gpu_study.sh batch --jobs {jobs[0]}"
            else:
                print(f"# call group {number}: {sum(len(b) for b in lane)} groups on {len(lane)} GPUs "
                      f"(kind with at least {len(lane)} GPUs)")
                command = (f"CALL_SECONDS={args.split_batches + 30:.0f} scripts/gpu_study.sh x{len(lane)} "
                           + " ".join(jobs))
            for call in range(1, calls + 1):
                partial = " --allow-partial" if call < calls else ""
                print(f"{command} {' '.join(passthrough)}{partial}")
    return 0 if not problems else 2


if __name__ == "__main__":
    sys.exit(main())
