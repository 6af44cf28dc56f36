"""`tapa bench cp`: training tokens/s and peak memory per GPU under context parallelism (`tapa
train --cp`, tapa.train.context_parallel), against CP 1 on the same GPUs at the same row, for the
models of `tapa bench model`. Run it under torchrun, one process per GPU:

    NCCL_NVLS_ENABLE=0 torchrun --standalone --nproc-per-node 8 -m tapa.cli bench cp \\
        --lengths 131072 262144 --pes tapa:LLLG:256 rope --cp 8 4 2 1 --checkpointing on

Each CP size n runs on all W processes as `tapa train --cp n` trains: W / n data groups of n
ranks, each group training one row a step, sharded over its ranks (ContextParallel.shard), the
model in DDP over all W. CP 1 is thus plain data parallelism, each GPU training a whole row: the
reference, measured in the same run on the same GPUs with the same gradient all-reduce. One
training step is bench model's (training_step: bf16 autocast, float32 loss, backward, fused AdamW),
timed after `warmup` untimed steps. At each row the sizes run largest first: an out of memory at
CP 1, which ends a multi-process run (below), comes after that row's sharded measurements.

Columns: tokens_per_s = rows a step (W / n) x row length / step time; tokens_per_s_per_gpu = that
/ W; step_ms and peak_mem_gib (torch.cuda.max_memory_allocated) are the slowest and the largest
over the ranks ("n/a" on CPU, which has no such counter); *_vs_cp1 divide a row's tokens/s per
GPU and memory by CP 1's, same model, row and checkpointing, when this run measured it.

Out of memory (torch.OutOfMemoryError, CUDA) is recorded as a row whose attention is "OOM". With
more than one process the run then ends: the rank that ran out leaves the others waiting in a
collective that never completes, so it writes the CSV (every rank holds the same rows), says so,
and exits non-zero, which makes torchrun stop the rest. --find-longest doubles the row from
--lengths until that happens; hence one model, one CP size and one checkpointing setting a run.

--doc-mask MEAN_LEN packs each row with documents of random lengths (bench model's packing: an
exponential with this mean, seeded per data group) and trains with document masking, sharded
with the row (`ContextParallel.shard(documents=)`) under CP and whole at CP 1.

    tapa bench cp --cpu-smoke                   # the same code on CPU processes (gloo), tiny model, rows of 64 and 128
"""

from __future__ import annotations

import argparse
import csv
import gc
import itertools
import os
import platform
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from tapa.bench.model import (BENCH_MODEL, SMOKE_MODEL, attention_path, checkpointing_name, document_ids,
                              gpu_slug, new_model, parse_checkpointing, parse_variant, time_steps,
                              training_step)
from tapa.model import Documents, ModelConfig
from tapa.train.context_parallel import ContextParallel
from tapa.train.distributed import DistInfo, launched_by_torchrun, setup_distributed, teardown
from tapa.train.parallelize import parallelize, resolve_parallel

BENCH_LENGTHS, SMOKE_LENGTHS = [131072, 262144], [64, 128]
FIELDS = ("model", "pe", "attention", "checkpointing", "doc_mask", "seq_len", "cp", "processes", "rows",
          "step_ms", "tokens_per_s", "tokens_per_s_per_gpu", "peak_mem_gib",
          "tokens_per_gpu_vs_cp1", "mem_vs_cp1")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--lengths", type=int, nargs="+", default=None,
                        help="row lengths, tokens (default: 131072 262144; with --cpu-smoke 64 "
                             "128); with --find-longest, the one row to start doubling from")
    parser.add_argument("--pes", nargs="+", default=["tapa:LLLG:256", "rope"],
                        help="models, as bench model's --pes (default: tapa:LLLG:256 rope)")
    parser.add_argument("--cp", type=int, nargs="+", default=None,
                        help="CP sizes, each dividing the number of processes; CP 1 is the "
                             "reference (default: the number of processes and 1)")
    parser.add_argument("--checkpointing", type=parse_checkpointing, default=(True,),
                        help="activation checkpointing, as bench model's: off, on, both, or a "
                             "comma list of off, on and block counts (default on)")
    parser.add_argument("--doc-mask", type=int, default=0, metavar="MEAN_LEN",
                        help="pack each row with documents of random lengths (exponential, this "
                             "mean, seeded per data group) and train with document masking; 0: off")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps per config (default 1)")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per config (default 3)")
    parser.add_argument("--find-longest", action="store_true",
                        help="double the row from --lengths until a GPU runs out of memory and "
                             "report the longest that trained (CUDA; one --pes, --cp and "
                             "--checkpointing setting)")
    parser.add_argument("--csv", default=None,
                        help="the results (default: runs/bench/cp-<gpu>.csv, e.g. cp-h200.csv)")
    parser.add_argument("--cpu-smoke", action="store_true",
                        help="a tiny float32 model on CPU processes (gloo) through the same code "
                             "(for tests; its numbers are no results)")


def check_plan(args: argparse.Namespace, sizes: list[int], world: int) -> None:
    """SystemExit with one line for a plan that cannot run: rows that a CP size cannot cut,
    sizes that the processes cannot form, --find-longest with more than one config."""
    if args.find_longest:
        if args.cpu_smoke:
            raise SystemExit("tapa bench cp: --find-longest needs CUDA: it doubles the row until a "
                             "GPU runs out of memory, which a CPU run never shows")
        if len(args.lengths) != 1 or len(args.pes) != 1 or len(sizes) != 1 or len(args.checkpointing) != 1:
            raise SystemExit("tapa bench cp: --find-longest searches one config a run (its first "
                             "out of memory ends a multi-process run): give one --lengths (the "
                             "start), one --pes, one --cp and one --checkpointing setting")
    if min(sizes) < 1 or min(args.lengths) < 1:
        raise SystemExit("tapa bench cp: --cp sizes and --lengths are positive")
    if args.doc_mask < 0:
        raise SystemExit(f"tapa bench cp: --doc-mask is the documents' mean length in tokens (0: "
                         f"off), got {args.doc_mask}")
    for size in sizes:
        for length in args.lengths:
            if length % (2 * size) and size > 1:
                raise SystemExit(f"tapa bench cp: --lengths {length} under --cp {size}: a row is cut "
                                 f"into 2 x {size} = {2 * size} equal chunks (head-tail load "
                                 f"balancing), and {length} is not a multiple of {2 * size}")
    largest = max(sizes)
    if largest > 1 and world == 1:
        raise SystemExit(f"tapa bench cp: --cp {largest} shards each row over {largest} processes: "
                         f"run it under torchrun --nproc-per-node {largest} -m tapa.cli bench cp ...")
    for size in sizes:
        if world % size:
            raise SystemExit(f"tapa bench cp: --cp {size} needs a number of processes divisible by "
                             f"{size}; torchrun started {world}")


def measure(cfg: ModelConfig, *, seq_len: int, parallel: ContextParallel | None, info: DistInfo,
            checkpointing: bool | int, warmup: int, steps: int, doc_mask: int = 0) -> dict:
    """Time training steps of a fresh model on rows of seq_len tokens, sharded by `parallel`
    (None: CP 1, each rank its own row), packed with documents of mean length doc_mask (0: one
    sequence); the row with the slowest step and largest peak memory over the ranks (the same on
    every rank)."""
    device = info.device
    model, optimizer = new_model(cfg, device, checkpointing=checkpointing)
    wrapped = parallelize(model, resolve_parallel("auto", info), info, bf16=device.type == "cuda")
    data_rank, rows = (parallel.dp_rank, parallel.dp) if parallel else (info.rank, info.world_size)
    # the ranks of a data group train the same row; the groups, different ones
    generator = torch.Generator().manual_seed(data_rank)
    tokens = torch.randint(0, cfg.vocab_size, (1, seq_len + 1), generator=generator).to(device)
    inputs, targets, forward = tokens[:, :-1], tokens[:, 1:], {}
    documents = (Documents.from_ids(document_ids(1, seq_len, doc_mask, device, seed=data_rank))
                 if doc_mask else None)
    if parallel is not None:
        inputs, targets, shard = parallel.shard(inputs, targets, documents=documents)
        forward["context_parallel"] = shard
    elif documents is not None:
        forward["document_ids"] = documents
    path = attention_path(cfg, device, documents=bool(doc_mask))
    step = training_step(wrapped, optimizer, path, device, inputs, targets=targets, **forward)
    step_s, loss = time_steps(step, warmup=warmup, steps=steps, device=device)
    if not torch.isfinite(loss):
        raise RuntimeError(f"non-finite loss in the {cfg.label} benchmark at row {seq_len}")
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0
    worst = torch.tensor([step_s, peak], dtype=torch.float64, device=device)
    if info.active and info.world_size > 1:
        dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    step_s, peak = worst.tolist()
    tokens_per_s = rows * seq_len / step_s
    row = {
        "model": f"{cfg.dim}d x {cfg.n_layers}L x {cfg.n_heads}h", "pe": cfg.label, "attention": path,
        "checkpointing": checkpointing, "doc_mask": doc_mask, "seq_len": seq_len, "cp": parallel.cp if parallel else 1,
        "processes": info.world_size, "rows": rows, "step_ms": round(1e3 * step_s, 2),
        "tokens_per_s": round(tokens_per_s, 1),
        "tokens_per_s_per_gpu": round(tokens_per_s / info.world_size, 1),
        "peak_mem_gib": round(peak / 2**30, 2) if device.type == "cuda" else "n/a",
    }
    del step, wrapped, model, optimizer
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return row


def fill_ratios(rows: list[dict]) -> None:
    """tokens_per_gpu_vs_cp1 and mem_vs_cp1 of each measured row whose CP 1 row was measured."""
    for row in rows:
        reference = next((r for r in rows if r["cp"] == 1 and r.get("tokens_per_s")
                          and (r["pe"], r["seq_len"], r["checkpointing"])
                          == (row["pe"], row["seq_len"], row["checkpointing"])), None)
        if reference is None or not row.get("tokens_per_s"):
            continue
        row["tokens_per_gpu_vs_cp1"] = round(row["tokens_per_s_per_gpu"]
                                             / reference["tokens_per_s_per_gpu"], 3)
        memory = (row["peak_mem_gib"], reference["peak_mem_gib"])
        row["mem_vs_cp1"] = "n/a" if "n/a" in memory else round(memory[0] / memory[1], 3)


def write_csv(rows: list[dict], path: Path) -> None:
    """All rows so far, replacing the file in one move (a cut run keeps what it measured)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    with open(partial, "w", newline="") as handle:
        writer = csv.DictWriter(handle, FIELDS, restval="")
        writer.writeheader()
        writer.writerows({key: row.get(key, "") for key in FIELDS} for row in rows)
    os.replace(partial, path)


def markdown(rows: list[dict]) -> str:
    lines = ["| " + " | ".join(FIELDS) + " |", "|" + "---|" * len(FIELDS)]
    lines += ["| " + " | ".join(str(row.get(key, "")) for key in FIELDS) + " |" for row in rows]
    return "\n".join(lines)


def longest(rows: list[dict]) -> str:
    """The --find-longest answer: the longest row that trained, and the one that did not."""
    trained = [r["seq_len"] for r in rows if r.get("tokens_per_s")]
    failed = [r["seq_len"] for r in rows if r["attention"] == "OOM"]
    first = rows[0]
    config = (f"{first['pe']}, CP {first['cp']}, checkpointing {checkpointing_name(first['checkpointing'])}, "
              f"{first['processes']} process(es)")
    if not trained:
        return f"longest row that trained ({config}): none; {failed[0]:,} ran out of memory"
    return (f"longest row that trained ({config}): {max(trained):,} tokens"
            + (f"; {failed[0]:,} ran out of memory" if failed else ""))


def report(rows: list[dict], csv_path: Path, header: str, find_longest: bool) -> None:
    write_csv(rows, csv_path)
    print(header)
    print(markdown(rows))
    if find_longest:
        print(longest(rows))
    print(f"wrote {csv_path}", flush=True)


def run(args: argparse.Namespace) -> int:
    if not args.cpu_smoke and not torch.cuda.is_available():
        raise SystemExit("tapa bench cp needs CUDA GPUs (use --cpu-smoke to check the code path on "
                         "CPU processes)")
    world = int(os.environ["WORLD_SIZE"]) if launched_by_torchrun() else 1
    # a smoke's rows are bench model --cpu-smoke's: the GPU rows took minutes on CPU and then
    # ran out of memory there
    args.lengths = args.lengths or (SMOKE_LENGTHS if args.cpu_smoke else BENCH_LENGTHS)
    sizes = sorted(set(args.cp or [world, 1]), reverse=True)
    check_plan(args, sizes, world)
    info = setup_distributed("cpu" if args.cpu_smoke else "auto")
    try:
        return _run(args, sizes, info)
    finally:
        teardown(info)


def _run(args: argparse.Namespace, sizes: list[int], info: DistInfo) -> int:
    device = info.device
    model_kwargs = SMOKE_MODEL if args.cpu_smoke else BENCH_MODEL
    name = f"CPU ({platform.machine()})" if device.type == "cpu" else torch.cuda.get_device_name(device)
    csv_path = Path(args.csv or f"runs/bench/cp-{'cpu-smoke' if args.cpu_smoke else gpu_slug(name)}.csv")
    header = (f"tapa bench cp: {info.world_size} x {name}; torch {torch.__version__}; "
              f"warmup {args.warmup}, {args.steps} timed steps; one row per data group a step")
    meshes = {size: ContextParallel(size, device.type) for size in sizes if size > 1}
    if args.find_longest:
        lengths = (args.lengths[0] << doubling for doubling in itertools.count())
    else:
        lengths = iter(args.lengths)
    progress = info.is_main and sys.stderr.isatty()
    rows: list[dict] = []
    for seq_len in lengths:
        for pe, ckpt, size in itertools.product(args.pes, args.checkpointing, sizes):
            cfg = ModelConfig(**parse_variant(pe), **model_kwargs)
            try:
                row = measure(cfg, seq_len=seq_len, parallel=meshes.get(size), info=info,
                              checkpointing=ckpt, warmup=args.warmup, steps=args.steps,
                              doc_mask=args.doc_mask)
            except torch.OutOfMemoryError:
                row = {"pe": cfg.label, "attention": "OOM", "checkpointing": ckpt,
                       "doc_mask": args.doc_mask, "seq_len": seq_len, "cp": size,
                       "processes": info.world_size}
            rows.append(row)
            fill_ratios(rows)
            if row["attention"] == "OOM":
                if info.world_size > 1:
                    _end_after_out_of_memory(rows, csv_path, header, info, args.find_longest)
                gc.collect()  # outside the except: its traceback no longer pins memory
                torch.cuda.empty_cache()
            if info.is_main:
                write_csv(rows, csv_path)
            if progress:
                print(f"{row['pe']} L={seq_len} CP {size} ckpt={int(ckpt)}: "
                      f"{row.get('tokens_per_s', 'OOM')} tok/s", file=sys.stderr, flush=True)
        if args.find_longest and rows[-1]["attention"] == "OOM":
            break
    if info.is_main:
        report(rows, csv_path, header, args.find_longest)
    return 0


def _end_after_out_of_memory(rows, csv_path: Path, header: str, info: DistInfo, find_longest: bool):
    """The rank that caught the out-of-memory reports (its rows are every rank's) and exits
    non-zero without the process group's teardown, which would wait for the stuck collectives;
    torchrun then stops the other ranks."""
    row = rows[-1]
    print(f"tapa bench cp: rank {info.rank} ran out of GPU memory at row {row['seq_len']} "
          f"({row['pe']}, CP {row['cp']}); with {info.world_size} processes the others wait in a "
          "collective it will not join, so the run ends here", file=sys.stderr, flush=True)
    report(rows, csv_path, header, find_longest)
    sys.stdout.flush()
    os._exit(1)
