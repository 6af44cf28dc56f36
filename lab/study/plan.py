"""From jobs to commands: which runs a batch of study jobs needs, and the `tapa` command of each.

A job is (arm, lr, seed). Jobs whose arms share pretraining flags form a group: one pretraining
run, its zero-shot evaluation, and one continual run (+ evaluation and passkey grid) per distinct
continual recipe. A group is what one worker process runs, stage after stage, so nothing is
trained twice and a group's stages need no other process's files.
"""

from __future__ import annotations

import argparse
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from lab.study.arms import ARMS, FAMILIES, STAGES, SWEEP_ARM, Arm, Estimates, Protocol, ratio_pattern

from tapa.train.config import load_recipe


@dataclass(frozen=True)
class Job:
    arm: str
    lr: float
    seed: int

    @property
    def id(self) -> str:
        return f"{self.arm}:{self.lr:g}:{self.seed}"

    @property
    def slug(self) -> str:
        return f"{self.arm}-lr{self.lr:g}-s{self.seed}"


@dataclass
class Stage:
    name: str  # unique in its group: pretrain, eval0, continual-<arm>, eval1-<arm>, passkey-<arm>
    kind: str  # one of STAGES
    argv: list  # tapa argv (without the leading "tapa"), or ["-m", module, ...] for python3 -m
    out: str  # the run directory or the evaluation folder it writes
    needs: list = field(default_factory=list)
    tokens: int = 0  # training tokens (train stages)
    methods: int = 0  # models evaluated (evaluation stages)
    prompts: int = 0  # retrieval-suite prompts per model (the passkey stage of screen protocols)

    def command(self) -> str:
        return ("python3 " if self.argv[0] == "-m" else "tapa ") + shlex.join(self.argv)


@dataclass
class Group:
    id: str
    jobs: list
    stages: list = field(default_factory=list)

    def stage(self, name: str) -> Stage | None:
        return next((s for s in self.stages if s.name == name), None)


def parse_jobs(text: str) -> list[Job]:
    """'arm:lr:seed,arm:lr:seed' -> jobs; a clear error naming the bad entry."""
    jobs = []
    for item in (part.strip() for part in text.split(",") if part.strip()):
        pieces = item.split(":")
        if len(pieces) != 3 or pieces[0] not in ARMS:
            raise ValueError(f"--jobs: {item!r} is not arm:lr:seed with an arm of {list(ARMS)}")
        try:
            lr, seed = float(pieces[1]), int(pieces[2])
        except ValueError as err:
            raise ValueError(f"--jobs: {item!r}: lr must be a number and seed an int") from err
        if lr <= 0 or seed < 0:
            raise ValueError(f"--jobs: {item!r}: lr must be > 0 and seed >= 0")
        jobs.append(Job(pieces[0], lr, seed))
    if not jobs:
        raise ValueError("--jobs: no jobs given")
    return list(dict.fromkeys(jobs))


def parse_lr_map(text: str | None) -> dict[str, float]:
    """'rope=1e-3,tapa=2e-3,tapa-linear=5e-4' -> {family or arm: lr}. An arm's own entry wins over
    its family's (an arm that diverges at its family's best lr, as TAPA linear phase does)."""
    values = {}
    for item in (part.strip() for part in (text or "").split(",") if part.strip()):
        name, _, value = item.partition("=")
        if (name not in FAMILIES and name not in ARMS) or not value:
            raise ValueError(f"--lr: {item!r} is not name=lr with a family of {FAMILIES} "
                             f"or an arm of {list(ARMS)}")
        values[name] = float(value)
    return values


def arm_lr(arm: str, lrs: dict[str, float]) -> float | None:
    """The lr `lrs` gives `arm`: its own entry, else its family's (None: neither)."""
    return lrs.get(arm, lrs.get(ARMS[arm].family))


def plan_jobs(plan: str, protocol: Protocol, *, families=FAMILIES, arms=None, lrs=None,
              seeds=None) -> list[Job]:
    """lr-sweep: each family's sweep arm (or `arms`) at the protocol's lrs, seed 0.
    seeds: every arm of `families` (or `arms`) at its lr from `lrs` (`arm_lr`), at `seeds`."""
    unknown = [f for f in families if f not in FAMILIES]
    if unknown:
        raise ValueError(f"--families: unknown {unknown}; choose from {FAMILIES}")
    if plan == "lr-sweep":
        chosen = arms or [SWEEP_ARM[f] for f in families]
        return [Job(arm, lr, (seeds or [0])[0]) for arm in chosen for lr in protocol.sweep_lrs]
    if plan == "seeds":
        chosen = arms or [a.name for a in ARMS.values() if a.family in families]
        lrs = lrs or {}
        missing = sorted({ARMS[a].family for a in chosen if arm_lr(a, lrs) is None})
        if missing:
            raise ValueError(f"--plan seeds needs --lr for the families {missing} "
                             "(family=lr, the lr sweep's best)")
        return [Job(arm, arm_lr(arm, lrs), seed) for seed in (seeds or protocol.seeds)
                for arm in chosen]
    raise ValueError(f"--plan must be lr-sweep or seeds, got {plan!r}")


def _owner(arm: Arm, same) -> str:
    """The first arm of the table whose flags equal `arm`'s under `same` (names shared runs)."""
    return next(a.name for a in ARMS.values() if same(a) == same(arm))


def pretrain_owner(arm: Arm) -> str:
    return _owner(arm, lambda a: a.pretrain)


def continual_owner(arm: Arm) -> str:
    return _owner(arm, lambda a: (a.pretrain, a.continual, a.continual_lr_scale, a.convert))


def continual_scale(arm: Arm, protocol: Protocol) -> float:
    """The arm's continual peak lr over its pretraining one: its own scale, else the protocol's."""
    return protocol.continual_lr_scale if arm.continual_lr_scale is None else arm.continual_lr_scale


def stage_closure(stages) -> list[str]:
    """The requested stages plus the ones they read: an evaluation reads its run, a continual
    run reads the pretrained one."""
    wanted = set(stages)
    unknown = wanted - set(STAGES)
    if unknown:
        raise ValueError(f"--stages: unknown {sorted(unknown)}; choose from {STAGES}")
    if wanted & {"eval1", "domain1", "passkey"}:
        wanted.add("continual")
    if wanted:
        wanted.add("pretrain")
    return [s for s in STAGES if s in wanted]


def job_stages(job: Job, stages) -> list[str]:
    """The group stages (names) a job reads, in order. Only the arm that owns the pretraining
    run reads its theory stage (the others share the same weights)."""
    arm = ARMS[job.arm]
    owner = continual_owner(arm)
    names = {"pretrain": "pretrain", "eval0": "eval0", "domain0": "domain0",
             "continual": f"continual-{owner}", "eval1": f"eval1-{owner}",
             "domain1": f"domain1-{owner}", "passkey": f"passkey-{owner}", "theory": "theory"}
    skip = {"eval0", "domain0"} if not arm.zero_shot else set()
    if pretrain_owner(arm) != arm.name:
        skip.add("theory")
    wanted = [names[s] for s in stages if s not in skip]
    if ARMS[owner].convert and f"continual-{owner}" in wanted:  # a retrofit converts first
        wanted.insert(wanted.index(f"continual-{owner}"), f"convert-{owner}")
    return wanted


def _csv(values) -> str:
    return ",".join(f"{v:g}" for v in values)


def build_groups(jobs: list[Job], protocol: Protocol, stages, root: Path,
                 train_extra=(), cache_dir: str | None = None) -> list[Group]:
    """Groups of jobs that share a pretraining run, each with its stages and commands.
    train_extra: flags added last to every `tapa train` (so they win over the protocol's)."""
    stages = stage_closure(stages)
    cache_dir = cache_dir or str(root / "cache" / "data")
    by_key: dict[tuple, Group] = {}
    for job in jobs:
        arm = ARMS[job.arm]
        key = (pretrain_owner(arm), job.lr, job.seed)
        gid = f"{key[0]}-lr{job.lr:g}-s{job.seed}"
        by_key.setdefault(key, Group(gid, [])).jobs.append(job)
    for group in by_key.values():
        first = group.jobs[0]
        lr, seed, arm0 = first.lr, first.seed, ARMS[first.arm]
        base = root / "runs" / group.id
        train_common = ["train", "--recipe", protocol.recipe, *protocol.data, "--cache-dir", cache_dir,
                        *pretrain_flags(arm0, protocol, lr), "--seed", str(seed),
                        "--device", protocol.device, "--no-progress", "--name", group.id]
        windows = ["--lengths", _csv(protocol.eval_lengths), "--stride", str(protocol.eval_stride),
                   "--max-tokens", str(protocol.eval_tokens)]
        evaluation = [*windows, "--split", "test", "--device", protocol.device, "--no-progress"]
        passkey = ["--lengths", str(protocol.continual_len), "--max-tokens",
                   str(protocol.continual_len),  # tapa eval always scores perplexity: one window
                   "--passkey", "--passkey-lengths", _csv(protocol.passkey_lengths),
                   "--passkey-depths", _csv(protocol.passkey_depths),
                   "--passkey-trials", str(protocol.passkey_trials), "--passkey-filler", "corpus",
                   "--seed", "0", "--device", protocol.device, "--no-progress"]
        if protocol.retrieval_tasks:  # the retrieval suite on the passkey's grid
            passkey += ["--tasks", ",".join(protocol.retrieval_tasks),
                        "--task-lengths", _csv(protocol.passkey_lengths),
                        "--task-depths", _csv(protocol.passkey_depths)]
            if protocol.task_trials:
                passkey += ["--task-trials", str(protocol.task_trials)]
        # the second domain: all of its text (--data reads every document), the same lengths
        domain = ["--data", str(domain_dir(root, protocol)), *windows, "--device", protocol.device,
                  "--no-progress"] if protocol.domain else None
        pre_dir = str(base / "pretrain")
        needed = {name for job in group.jobs for name in job_stages(job, stages)}
        if "pretrain" in needed:
            group.stages.append(Stage(
                "pretrain", "pretrain",
                train_common + ["--seq-len", str(protocol.pretrain_len),
                                "--batch-size", str(protocol.pretrain_batch),
                                "--steps", str(protocol.pretrain_steps), *protocol.pretrain_flags,
                                *train_extra, "--run-dir", pre_dir],
                pre_dir, tokens=protocol.pretrain_tokens))
        zero_shot = [ARMS[j.arm] for j in group.jobs if ARMS[j.arm].zero_shot]
        if "eval0" in needed:
            group.stages.append(_eval_stage("eval0", "eval0", pre_dir, base, evaluation,
                                            zero_shot, ["pretrain"], protocol.pretrain_len))
        if "domain0" in needed and domain:
            group.stages.append(_eval_stage("domain0", "domain0", pre_dir, base, domain,
                                            zero_shot, ["pretrain"], protocol.pretrain_len))
        if "theory" in needed:
            group.stages.append(Stage(
                "theory", "theory",
                ["-m", "tapa.theory.trained", pre_dir, "--seq-len", str(protocol.theory_len),
                 "--sequences", str(protocol.theory_sequences), "--device", protocol.device,
                 "--out", str(base / "theory")], str(base / "theory"), needs=["pretrain"], methods=1))
        for owner in dict.fromkeys(continual_owner(ARMS[j.arm]) for j in group.jobs):
            users = [ARMS[j.arm] for j in group.jobs if continual_owner(ARMS[j.arm]) == owner]
            cont_dir = str(base / f"continual-{owner}")
            init, start, needs = pre_dir, [], ["pretrain"]
            if ARMS[owner].convert and f"convert-{owner}" in needed:
                # a retrofit: the pretrained run converted, then continued from the converted
                # folder, which names its tokenizer but not its text: the recipe's source
                init = str(base / f"convert-{owner}")
                start = ["--data", load_recipe(protocol.recipe)["data"].get("source", "builtin")]
                needs = ["pretrain", f"convert-{owner}"]
                group.stages.append(Stage(f"convert-{owner}", "convert",
                                          ["convert", pre_dir, init, *ARMS[owner].convert],
                                          init, needs=["pretrain"], methods=1))
            if f"continual-{owner}" in needed:
                group.stages.append(Stage(
                    f"continual-{owner}", "continual",
                    # the arm's continual flags after the protocol's: a repeated flag keeps its
                    # last value, so an arm may change the protocol's (e.g. --passkey-fraction)
                    train_common + ["--init-from", init, *start,
                                    "--seq-len", str(protocol.continual_len),
                                    "--batch-size", str(protocol.continual_batch),
                                    "--steps", str(protocol.continual_steps),
                                    *protocol.continual_flags,
                                    *_fill(ARMS[owner].continual, protocol),
                                    "--lr", f"{lr * continual_scale(ARMS[owner], protocol):g}",
                                    *train_extra, "--run-dir", cont_dir],
                    cont_dir, needs=needs, tokens=protocol.continual_tokens))
            for kind, flags in (("eval1", evaluation), ("domain1", domain), ("passkey", passkey)):
                if f"{kind}-{owner}" in needed and flags:
                    stage = _eval_stage(f"{kind}-{owner}", kind, cont_dir, base, flags, users,
                                        [f"continual-{owner}"], protocol.pretrain_len)
                    stage.prompts = task_prompts(protocol) if kind == "passkey" else 0
                    group.stages.append(stage)
    return list(by_key.values())


def task_prompts(protocol: Protocol) -> int:
    """Prompts the retrieval suite runs per model: tasks x lengths x depths x trials."""
    if not protocol.retrieval_tasks:
        return 0
    from tapa.eval.tasks import default_trials, parse_tasks

    tasks = parse_tasks(",".join(protocol.retrieval_tasks))
    trials = protocol.task_trials or default_trials(len(protocol.passkey_depths))
    return len(tasks) * len(protocol.passkey_lengths) * len(protocol.passkey_depths) * trials


def domain_dir(root: Path, protocol: Protocol) -> Path:
    """Where the runner builds the protocol's second domain (lab.study.domain)."""
    return root / "domain" / protocol.domain


def _fill(flags, protocol: Protocol) -> list[str]:
    """Arm flags with the protocol's values in place of {pretrain_len}, {continual_len}, {scale},
    and the ratio levers' layer patterns over its layers, {llg_pattern} and {l5g_pattern} (with
    {llg_globals}, {l5g_globals}: their global layers, and {n_layers})."""
    values = {**protocol.to_dict(), "scale": f"{protocol.continual_len / protocol.pretrain_len:g}",
              "n_layers": protocol.n_layers}
    for tag, every in (("llg", 3), ("l5g", 6)):
        values[f"{tag}_pattern"] = pattern = ratio_pattern(values["n_layers"], every)
        values[f"{tag}_globals"] = pattern.count("G")
    return [flag.format(**values) for flag in flags]


def pretrain_flags(arm: Arm, protocol: Protocol, lr: float) -> list[str]:
    """The `tapa train` flags of the arm's pretraining under the protocol: its model, the arm's
    flags (filled per protocol) and the lr."""
    return [*protocol.model, *_fill(arm.pretrain, protocol), "--lr", f"{lr:g}"]


def arm_label(arm: Arm, protocol: Protocol) -> str:
    """The arm's label as its jobs record it: a ratio lever's names its layer pattern over the
    protocol's layers."""
    return _fill([arm.label], protocol)[0]


def _eval_stage(name, kind, run_dir, base, flags, arms, needs, temperature_base) -> Stage:
    """`tapa eval` of one run under every rule the arms reading it ask for (the run's own
    rule is always evaluated), and with the query temperature at `temperature_base` if one of
    them asks for it."""
    rules = sorted({a.eval_pe for a in arms if a.eval_pe})
    argv = ["eval", run_dir, *flags, "--out", str(base / name)]
    if rules:
        argv += ["--eval-pe", ",".join(rules)]
    tempered = any(a.eval_temperature for a in arms)
    if tempered:
        argv += ["--eval-query-temperature", str(temperature_base)]
    return Stage(name, kind, argv, str(base / name), needs=needs, methods=1 + len(rules) + tempered)


def check_flags(groups: list[Group]) -> list[str]:
    """Problems with the commands as this tapa parses them (a flag another branch adds and this
    checkout lacks), found before any GPU time is spent."""
    from tapa.eval import command as eval_command
    from tapa.hf import convert as convert_command
    from tapa.train import command as train_command

    from tapa.theory import trained

    parsers = {"-m": trained.build_parser()}
    for name, module in (("train", train_command), ("eval", eval_command),
                         ("convert", convert_command)):
        parsers[name] = argparse.ArgumentParser(prog=f"tapa {name}", add_help=False)
        module.add_arguments(parsers[name])
    problems = []
    for group in groups:
        for stage in group.stages:
            rest = stage.argv[2:] if stage.argv[0] == "-m" else stage.argv[1:]
            try:
                args, unknown = parsers[stage.argv[0]].parse_known_args(rest)
            except SystemExit:
                args, unknown = None, ["(argparse error above)"]
            if unknown:
                problems.append(f"{group.id} {stage.name}: this tapa {stage.argv[0]} does not know "
                                f"{unknown}")
            elif stage.argv[0] == "train" and not getattr(args, "init_from", None):  # a continual
                # stage takes its model from the run it starts from
                problems += [f"{group.id} {stage.name}: {p}" for p in _layout_problems(train_command, args)]
    return problems


def _layout_problems(train_command, args) -> list[str]:
    """The study's hybrids end in a global layer (LLLG over 8 layers: LLLGLLLG); a layer pattern
    that leaves the last layer local, as a short pattern repeated over a deeper model can, is a
    different model from the one an arm's name promises."""
    try:
        _, model, _ = train_command.configs_from_args(args)
    except (ValueError, SystemExit) as err:
        return [f"the model does not build: {err}"]
    kinds = [model.layer_kind(i) for i in range(model.n_layers)]
    if "local" in kinds and kinds[-1] != "global":
        return [f"layer pattern {model.layer_pattern!r} over {model.n_layers} layers leaves the last "
                f"layer local ({''.join(k[0].upper() for k in kinds)})"]
    return []


def estimate_stage(stage: Stage, est: Estimates, concurrent: int, observed: dict | None = None) -> float:
    """Seconds a stage should take with `concurrent` processes sharing the GPU. `observed`:
    seconds per token (train stages) or per method (evaluations) measured in this call."""
    observed = observed or {}
    if stage.kind in ("pretrain", "continual"):
        if stage.kind in observed:
            return observed[stage.kind] * stage.tokens
        return est.startup_s + stage.tokens / est.process_rate(concurrent)
    default = {"passkey": est.passkey_s_per_method + stage.prompts * est.task_s_per_prompt,
               "theory": est.theory_s, "convert": est.convert_s}.get(stage.kind, est.eval_s_per_method)
    return (observed.get(stage.kind) or default) * stage.methods


def split_batches(groups: list[Group], est: Estimates, concurrent: int, budget_s: float,
                  reserve_s: float = 20.0, calls: int = 1) -> list[list[Group]]:
    """Groups packed into batches of `calls` back-to-back device calls on one machine: longest
    first, each into the first batch whose simulated schedule (`concurrent` slots, the data built
    once at the start) still ends inside the calls' budgets."""
    capacity = calls * (budget_s - reserve_s)

    def cost(group):
        return sum(estimate_stage(s, est, concurrent) for s in group.stages)

    batches: list[tuple[list, list]] = []  # (groups, slot finish times)
    for group in sorted(groups, key=cost, reverse=True):
        for chosen, slots in batches:
            slot = min(range(len(slots)), key=slots.__getitem__)
            if slots[slot] + cost(group) <= capacity:
                chosen.append(group)
                slots[slot] += cost(group)
                break
        else:
            slots = [est.data_build_s] * concurrent
            slots[0] += cost(group)
            batches.append(([group], slots))
    return [chosen for chosen, _ in batches]


def gpu_lanes(batches: list[list[Group]], gpus: int) -> list[list[list[Group]]]:
    """One-GPU batches dealt out to multi-GPU calls: each call runs up to `gpus` batches side by
    side, one a GPU (scripts/gpu_study.sh xN), in the order split_batches made them."""
    if gpus < 1:
        raise ValueError(f"gpus must be >= 1, got {gpus}")
    return [batches[i:i + gpus] for i in range(0, len(batches), gpus)]
