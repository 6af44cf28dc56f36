"""One self-contained JSON per study job, read from the stage outputs under the runner's root, and
the one archive a device call sends back.

A job JSON ("kind": "tapa-study-job") holds the arm, lr, seed, protocol, the exact commands, the
corpus' token counts, each finished stage's results (training summaries with a loss curve,
perplexity per length, the passkey grid) and wall times, the hardware and the dates.
`python3 -m lab.study.aggregate aggregate` turns a folder (or archives) of them into tables and plots.
"""

from __future__ import annotations

import json
import shlex
import tarfile
from pathlib import Path

from lab.study.arms import ARMS, Protocol
from lab.study.plan import Group, Job, arm_label, continual_scale, job_stages

from tapa.train.saving import write_text_atomic
from tapa.train.rundir import read_metrics

JOB_KIND = "tapa-study-job"
CURVE_POINTS = 100  # loss-curve points kept per training stage


def done_marker(root: Path, group_id: str, stage_name: str) -> Path:
    return root / "runs" / group_id / "done" / f"{stage_name}.json"


def finished_stages(root: Path, group_id: str, stages) -> set[str]:
    """The names of the group's stages that are done with this plan's flags. A marker records the
    argv that finished its stage (plus `--resume` when a later call finished it). One left by other
    flags (the protocol changed between calls on a still-warm machine) is stale, and so is every
    stage that read a stale or unfinished stage's output. `stages`: Stage objects or their dicts,
    in plan order (a stage's needs come before it)."""
    done = set()
    for stage in stages:
        stage = stage if isinstance(stage, dict) else vars(stage)
        marker = read_json(done_marker(root, group_id, stage["name"]))
        if (marker and [a for a in marker["argv"] if a != "--resume"] == list(stage["argv"])
                and all(need in done for need in stage["needs"])):
            done.add(stage["name"])
    return done


def read_json(path: Path):
    return json.loads(Path(path).read_text()) if Path(path).is_file() else None


def write_json_atomic(path: Path, value) -> None:
    """The parent polls the workers' status and markers: write them through a rename."""
    write_text_atomic(Path(path), json.dumps(value))


def corpus_summary(manifest: dict, directory: str) -> dict:
    splits = {name: {k: counts[k] for k in ("docs", "bytes", "tokens")}
              for name, counts in manifest["splits"].items()}
    source = manifest.get("source", {})
    return {"directory": directory, "splits": splits, "train_tokens": splits["train"]["tokens"],
            "tokenizer_sha256": manifest["tokenizer"]["sha256"],
            "vocab_size": manifest["tokenizer"]["vocab_size"],
            "source": {k: source.get(k) for k in ("source", "kind", "python_version", "files",
                                                  "include_site_packages")},
            "created": manifest.get("created"), "build_seconds": manifest.get("build_seconds")}


def _training_summary(run_dir: Path) -> dict:
    config = read_json(run_dir / "config.json") or {}
    records = read_metrics(run_dir / "metrics.jsonl")
    last = records[-1]
    val = [r for r in records if r.get("val_loss") is not None]
    every = max(1, len(records) // CURVE_POINTS)
    curve = [[r["step"], round(r["loss"], 5), r.get("val_loss")] for r in records[::every]]
    if curve[-1][0] != last["step"]:
        curve.append([last["step"], round(last["loss"], 5), last.get("val_loss")])
    return {"steps": last["step"], "tokens": last["tokens"], "final_loss": last["loss"],
            "final_val_loss": val[-1]["val_loss"] if val else None,
            "tokens_per_s": last["tokens"] / last["elapsed_s"] if last["elapsed_s"] else None,
            "train_seconds": last["elapsed_s"], "num_parameters": config.get("num_parameters"),
            "precision": config.get("precision"), "device": config.get("device"),
            "torch_version": config.get("torch_version"), "init_from": config.get("init_from"),
            "model": config.get("model"), "train": config.get("train"),
            "curve": {"fields": ["step", "loss", "val_loss"], "points": curve}}


def _pick_method(results: dict, pe: str | None, temperature: bool = False) -> dict:
    """The method entry evaluated under `pe` (None: the model's own rule); with `temperature`, the
    one tapa eval --eval-query-temperature added (its `variant`)."""
    for method in results["methods"]:
        rule = (method["pe"] == pe) if pe else (method["pe"] == method["trained_pe"])
        if rule and bool(method.get("variant")) == temperature:
            return method
    what = (pe or "its own rule") + (" with the query temperature" if temperature else "")
    raise ValueError(f"no method evaluated under {what} in {results['runs']}")


def _evaluation_summary(out_dir: Path, pe: str | None, passkey: bool, temperature: bool = False) -> dict:
    """One evaluation stage's entry of the job JSON. With `temperature`, also the same model read
    without it (`without_temperature`): the lever's effect within one run, which a separate run of
    the base arm does not give where training is not repeatable to the digit (NoPE's, whose global
    layers attend through SDPA: a rerun of one seed moved its 30M zero-shot 16k perplexity 5.5%)."""
    results = read_json(out_dir / "results.json")
    method = _pick_method(results, pe, temperature)
    summary = {"label": method["label"], "pe": method["pe"], "trained_pe": method["trained_pe"],
               "train_len": method["train_len"], "split": results["split"],
               "stride": results["stride"], "max_tokens": results["max_tokens"],
               "hardware": results["hardware"], "date": results["date"]}
    if results.get("data"):  # which text it read: the run's corpus or a --data source
        summary["data"] = {k: results["data"].get(k) for k in ("source", "split", "tokens",
                                                                "run_corpus")}
    summary.update(_method_summary(method, passkey))
    if temperature:
        plain = _pick_method(results, pe)
        summary["without_temperature"] = {"label": plain["label"], **_method_summary(plain, passkey)}
    return summary


def _method_summary(method: dict, passkey: bool) -> dict:
    """A method's retrieval grids (passkey: the passkey's and the suite's tasks) or perplexity rows."""
    if passkey:
        return {"passkey": method["passkey"], **({"tasks": method["tasks"]} if method.get("tasks") else {})}
    rows = sorted(method["perplexity"], key=lambda r: r["length"])
    return {"perplexity": [{k: r[k] for k in ("length", "perplexity", "loss", "tokens", "windows",
                                               "rope_scale", "seconds")} for r in rows],
            "position_loss_longest": rows[-1]["buckets"]}


def _theory_summary(out_dir: Path) -> dict:
    """The pooled-over-heads rows of tapa.theory.trained's CSV, as columns."""
    import csv

    with open(out_dir / "theory_trained.csv", newline="") as handle:
        rows = [r for r in csv.DictReader(handle) if r["head"] == "all"]
    fields = ["estimate", "distance", "count", "mean", "var", "mean_se"]
    return {"layer": int(rows[0]["layer"]), "kind": rows[0]["kind"], "fields": fields,
            "rows": [[r["estimate"]] + [float(r[f]) if r[f] else None for f in fields[1:]] for r in rows]}


def job_summary(job: Job, group: Group, stages: list[str], protocol: Protocol, root: Path,
                context: dict) -> dict:
    """The job's JSON from whatever of its stages have finished (see the module docstring)."""
    arm = ARMS[job.arm]
    wanted = job_stages(job, stages)
    summary = {"kind": JOB_KIND, "version": 1, "job": job.id, "arm": arm.name,
               "arm_index": list(ARMS).index(arm.name), "label": arm_label(arm, protocol),
               "family": arm.family, "lr": job.lr, "seed": job.seed, "group": group.id,
               "eval_pe": arm.eval_pe, "eval_temperature": arm.eval_temperature,
               "protocol": protocol.to_dict(),
               # the aggregate labels continual results by it (the protocol's when the arm has none)
               "continual_lr_scale": continual_scale(arm, protocol),
               "protocol_id": protocol.fingerprint(), "stages_requested": wanted,
               "stages_done": [], "commands": {}, "wall_seconds": {}, "stage_dates": {},
               "results": {}, **context}
    hardware, kernels = set(), {}
    finished = finished_stages(root, group.id, group.stages)
    for name in wanted:
        stage = group.stage(name)
        if stage is None or name not in finished:
            continue
        marker = read_json(done_marker(root, group.id, name))
        kind = stage.kind
        summary["stages_done"].append(name)
        summary["commands"][kind] = stage.command()
        if marker["argv"] != stage.argv:  # finished by a later call: `--resume` from a checkpoint
            summary.setdefault("resumed", {})[kind] = "tapa " + shlex.join(marker["argv"])
        summary["wall_seconds"][kind] = marker["wall_s"]  # of the last call only, if resumed
        summary["stage_dates"][kind] = [marker["started"], marker["finished"]]
        hardware.add(marker["hardware"])
        if marker.get("kernels") is not None:  # recorded from 2026-12-01 (kernel Run 5) on
            kernels[kind] = marker["kernels"]
        if kind in ("pretrain", "continual"):
            summary["results"][kind] = _training_summary(Path(stage.out))
        elif kind == "convert":  # a retrofit's converted model: its command says it all
            summary["results"][kind] = {"out": stage.out}
        elif kind == "theory":
            summary["results"][kind] = _theory_summary(Path(stage.out))
        else:
            summary["results"][kind] = _evaluation_summary(Path(stage.out), arm.eval_pe,
                                                           passkey=kind == "passkey",
                                                           temperature=arm.eval_temperature)
    summary["complete"] = len(summary["stages_done"]) == len(wanted)
    summary["hardware"] = sorted(hardware)
    if kernels:
        summary["kernels"] = kernels  # per stage: the fused kernels' launch defaults it ran with
    pretrain = summary["results"].get("pretrain")
    corpus_tokens = (context.get("corpus") or {}).get("train_tokens")
    if pretrain and corpus_tokens:
        summary["pretrain_epochs"] = pretrain["tokens"] / corpus_tokens
    return summary


def pack(out_dir: Path, name: str, files: dict[str, Path]) -> Path:
    """One tar.gz in out_dir holding `files` ({name in the archive: path})."""
    out_dir.mkdir(parents=True, exist_ok=True)
    archive = out_dir / name
    with tarfile.open(archive, "w:gz") as tar:
        for arcname, path in sorted(files.items()):
            if Path(path).is_file():
                tar.add(path, arcname=arcname)
    return archive
