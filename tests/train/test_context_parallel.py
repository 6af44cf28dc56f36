"""Context parallelism (tapa.train.context_parallel, `tapa train --cp`): the geometry of the
head-tail shards and halos; the model's loss and gradients under CP over 2 and 4 gloo processes
(torch.multiprocessing) equal one process's, float64 to 1e-10 and float32 to 1e-5, for TAPA,
RoPE (plain and dynamic NTK, whose frequencies follow the row length), NoPE and the LLLG hybrid
with windows shorter and longer than a chunk, on plain rows and on packed documents (one-token
documents, documents cut by chunk boundaries and starting on them); DDP and FSDP2 on a 2 x 2
(data x context) mesh; and, end to end under torchrun, `tapa train --cp 2` (with and without
--doc-mask) against one process with checkpoints that resume from CP 2 on CP 1 and from CP 1 on
CP 2."""

from __future__ import annotations

import json
import shutil
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tapa.model import ModelConfig, TapaLM
from tapa.train.context_parallel import (check_length, halo_plan, rank_chunks, shard_positions,
                                         shard_sequence, unshard_sequence)

SEQ_LEN = 32
VOCAB = 61
TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-5}
# name -> model settings; every model has 4 layers (dim 32, 2 heads)
CASES = {
    "tapa": dict(pe="tapa"),
    "rope": dict(pe="rope"),
    "rope-dynamic-ntk": dict(pe="rope-dynamic-ntk", original_seq_len=16, n_kv_heads=1),
    "nope": dict(pe="nope"),
    # window 6: a halo of 5 keys, within one chunk at CP 2 (chunks of 8), across two at CP 4 (of 4)
    "hybrid": dict(pe="tapa", layer_pattern="LLLG", local_window=6),
    # window 11: a halo of 10 keys, over two chunks at CP 2 and three at CP 4
    "hybrid-wide": dict(pe="rope", layer_pattern="LLLG", local_window=11, n_kv_heads=1),
    # the global layer's query temperature (base 4) follows each token's global position (or its
    # position inside its document), not its slot in the rank's shard
    "hybrid-temperature": dict(pe="nope", layer_pattern="LLLG", local_window=6,
                               query_temperature_base=4, query_temperature_scale=0.5),
}


# ---------------------------------------------------------------------------------------------
# geometry, no processes

def test_head_tail_shards_cover_each_row_once_and_unshard():
    row = torch.arange(2 * 24).view(2, 24)
    for cp in (1, 2, 3):
        shards = [shard_sequence(row, cp, rank) for rank in range(cp)]
        assert torch.equal(unshard_sequence(shards), row)
        for rank, shard in enumerate(shards):
            assert torch.equal(shard[0], shard_positions(24, cp, rank))
    assert rank_chunks(2, 0) == (0, 3) and rank_chunks(2, 1) == (1, 2)
    assert shard_positions(8, 2, 1).tolist() == [2, 3, 4, 5]


def test_a_row_length_not_divisible_by_twice_cp_is_a_clear_error():
    with pytest.raises(ValueError, match=r"row length 30 is not a multiple of 8.*--seq-len"):
        check_length(30, 4)
    from tapa.train.config import TrainConfig

    with pytest.raises(ValueError, match=r"seq_len \(30\).*multiple of 2 x cp = 8"):
        TrainConfig(seq_len=30, cp=4)
    assert TrainConfig(seq_len=32, cp=2, doc_mask=True).doc_mask  # packed documents shard too


@pytest.mark.parametrize("cp,chunk,halo", [(2, 8, 5), (4, 4, 5), (4, 4, 10), (3, 2, 7), (2, 8, 100)])
def test_the_halo_plan_brings_exactly_the_keys_before_each_chunk(cp, chunk, halo):
    pieces, lengths = halo_plan(cp, chunk, halo)
    local = {rank: shard_positions(2 * cp * chunk, cp, rank).tolist() for rank in range(cp)}
    for dst in range(cp):
        buffer = [None] * sum(lengths[dst])
        for piece in (p for p in pieces if p.dst == dst):
            buffer[piece.dst_start:piece.dst_start + piece.length] = \
                local[piece.src][piece.src_start:piece.src_start + piece.length]
        want = []
        for j in rank_chunks(cp, dst):
            want += list(range(max(0, j * chunk - halo), j * chunk))
        assert buffer == want


# ---------------------------------------------------------------------------------------------
# the model under CP in spawned gloo processes

def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _model(case: str, dtype) -> TapaLM:
    """float64: large weights and TAPA phases (phase_init_scale 1), so that every position matters
    far above 1e-10; float32: milder ones, whose one-process float32 gradients are within ~1e-6 of
    float64's (with the float64 settings float32 itself is off by 3e-4)."""
    torch.manual_seed(0)
    scale = dict(init_std=0.2, phase_init_scale=1.0) if dtype == torch.float64 else dict(init_std=0.1)
    cfg = ModelConfig(vocab_size=VOCAB, dim=32, n_layers=4, n_heads=2, **scale, **CASES[case])
    return TapaLM(cfg).to(dtype)


def _batch(rows: int = 2):
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (rows, SEQ_LEN + 1), generator=gen)
    return ids[:, :-1], ids[:, 1:]


# each row's document starts: one-token documents (3, 31 and a row's first two tokens), documents
# that cross chunk boundaries (8 and 16 at CP 2; every 4 at CP 4) and start on them (8, 24), a
# document longer than rope-dynamic-ntk's original_seq_len (2 .. 22: its frequencies follow the
# whole row's longest document, not a shard's), and a row that is one document
DOCUMENT_STARTS = ([0, 3, 4, 13, 24, 27], [0, 1, 2, 23, 31], [0, 8, 9, 30], [0])


def _labels(rows: int) -> torch.Tensor:
    labels = torch.zeros(rows, SEQ_LEN, dtype=torch.long)
    for row in range(rows):
        for start in DOCUMENT_STARTS[row % len(DOCUMENT_STARTS)][1:]:
            labels[row, start:] += 1
    return labels


def _reference(case, dtype, rows=2, checkpoint_blocks=False, docs=False):
    model = _model(case, dtype)
    model.checkpoint_blocks = checkpoint_blocks
    inputs, targets = _batch(rows)
    loss = model(inputs, targets=targets, document_ids=_labels(rows) if docs else None)
    loss.backward()
    return loss.detach(), {name: p.grad for name, p in model.named_parameters()}


def _check(name, loss, grads, want_loss, want_grads, dtype):
    tol = TOLERANCE[dtype]
    assert abs(float(loss - want_loss)) <= tol, (name, float(loss), float(want_loss))
    for key, want in want_grads.items():
        error = float((grads[key] - want).abs().max() / want.abs().max().clamp_min(1e-30))
        assert error <= tol, (name, key, error)


def _mean_grads(model) -> dict:
    """The gradient the data-parallel wrapper would apply: the mean over all ranks."""
    grads = {}
    for name, param in model.named_parameters():
        grad = param.grad.detach().clone()
        dist.all_reduce(grad)
        grads[name] = grad / dist.get_world_size()
    return grads


def _cp_worker(rank: int, world: int, port: int, jobs: list) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    try:
        from tapa.train.context_parallel import ContextParallel

        parallel = {}
        for job in jobs:
            kind, case, dtype = job["kind"], job["case"], job["dtype"]
            cp = job.get("cp", world)
            if cp not in parallel:
                parallel[cp] = ContextParallel(cp, "cpu")
            par = parallel[cp]
            name = f"{kind} {case} {dtype} cp={cp}"
            if kind == "error":
                inputs = torch.zeros(2, SEQ_LEN - 2, dtype=torch.long)
                try:
                    par.shard(inputs, inputs)
                except ValueError as err:
                    assert "not a multiple of" in str(err), err
                else:
                    raise AssertionError("a row length not divisible by 2 cp was accepted")
                continue
            rows, docs = 2 * par.dp, job.get("docs", False)
            name += " documents" if docs else ""
            want_loss, want_grads = _reference(case, dtype, rows, job.get("checkpoint_blocks", False),
                                               docs)
            model = _model(case, dtype)
            model.checkpoint_blocks = job.get("checkpoint_blocks", False)
            inputs, targets = _batch(rows)
            labels = _labels(rows) if docs else None
            mine = slice(par.dp_rank * 2, par.dp_rank * 2 + 2)  # this data group's rows
            local_inputs, local_targets, shard = par.shard(
                inputs[mine], targets[mine], documents=labels[mine] if docs else None)
            if kind == "plain":
                loss = model(local_inputs, targets=local_targets, context_parallel=shard)
                loss.backward()
                grads = _mean_grads(model)
                # the model's logits, unsharded, are the one-process logits
                logits = par.unshard(model(local_inputs, context_parallel=shard).detach())
                want_logits = _model(case, dtype)(
                    inputs[mine], document_ids=labels[mine] if docs else None).detach()
                error = (logits - want_logits).abs().max() / want_logits.abs().max()
                assert float(error) <= TOLERANCE[dtype], (name, float(error))
            elif kind == "ddp":
                from torch.nn.parallel import DistributedDataParallel

                wrapped = DistributedDataParallel(model)
                loss = wrapped(local_inputs, targets=local_targets, context_parallel=shard)
                loss.backward()
                grads = {n: p.grad for n, p in model.named_parameters()}
            elif kind == "fsdp":
                from torch.distributed.device_mesh import init_device_mesh
                from torch.distributed.fsdp import fully_shard

                mesh = init_device_mesh("cpu", (world,))
                for block in model.layers:
                    fully_shard(block, mesh=mesh)
                fully_shard(model, mesh=mesh)
                loss = model(local_inputs, targets=local_targets, context_parallel=shard)
                loss.backward()
                grads = {n: p.grad.full_tensor() for n, p in model.named_parameters()}
            _check(name, loss.detach(), grads, want_loss, want_grads, dtype)
    finally:
        dist.destroy_process_group()


def _spawn(world: int, jobs: list) -> None:
    mp.spawn(_cp_worker, args=(world, _free_port(), jobs), nprocs=world, join=True)


def _jobs(cp=None):
    extra = {} if cp is None else {"cp": cp}
    jobs = [dict(kind="plain", case=case, dtype=dtype, **extra)
            for case in CASES for dtype in (torch.float64, torch.float32)]
    jobs.append(dict(kind="plain", case="hybrid", dtype=torch.float64, checkpoint_blocks=True, **extra))
    jobs += [dict(kind="plain", case=case, dtype=torch.float64, docs=True, **extra) for case in CASES]
    jobs.append(dict(kind="plain", case="hybrid", dtype=torch.float32, docs=True, **extra))
    jobs.append(dict(kind="plain", case="hybrid", dtype=torch.float64, checkpoint_blocks=True,
                     docs=True, **extra))
    return jobs + [dict(kind="error", case="-", dtype=torch.float64, **extra)]


def test_two_processes_give_the_one_process_loss_and_gradients():
    _spawn(2, _jobs())


# 4 processes on 2 cores: ~14 s to start, ~1.5 s a job (measured 2026-12-04)
@pytest.mark.slow
def test_four_processes_context_and_data_by_ddp_and_fsdp2():
    jobs = [dict(kind="plain", case=case, dtype=torch.float64, docs=docs)  # CP 4
            for case in CASES for docs in (False, True)]
    jobs += [dict(kind="plain", case=case, dtype=torch.float32) for case in ("tapa", "hybrid-wide")]
    jobs.append(dict(kind="error", case="-", dtype=torch.float64))
    # a 2 x 2 mesh, data x context, under DDP and FSDP2
    jobs += [dict(kind=kind, case="hybrid", dtype=torch.float64, cp=2) for kind in ("ddp", "fsdp")]
    jobs.append(dict(kind="ddp", case="hybrid-wide", dtype=torch.float64, cp=2, docs=True))
    _spawn(4, jobs)


# ---------------------------------------------------------------------------------------------
# end to end: tapa train --cp 2 under torchrun, checkpoints across CP sizes

# a hybrid whose window (8) crosses the chunks (8 tokens at seq_len 32 and CP 2)
E2E_MODEL = dict(n_layers=4, layer_pattern="LLLG", local_window=8)
E2E_TOLERANCE = 1e-5  # float32 training: sums in another order move the last bits


def _configs(run_dir, cache_dir, **train):
    from trainkit import small_configs

    return small_configs(run_dir, cache_dir, model=E2E_MODEL, **train)


def _close(a, b):
    return len(a) == len(b) and all(abs(x - y) <= E2E_TOLERANCE for x, y in zip(a, b))


@pytest.fixture(scope="module")
def single(tmp_path_factory, cache_dir):
    """The reference: one process, 6 steps, checkpoints at 3 and 6."""
    from tapa.train.trainer import train

    run_dir = tmp_path_factory.mktemp("runs") / "single"
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train(*_configs(run_dir, cache_dir))
    finally:  # later modules' tests see the machine's thread count again
        torch.set_num_threads(previous)
    return run_dir


# each end-to-end test: one torchrun of 2 processes and one in-process run, ~7 s on 2 cores
def test_tapa_train_cp2_matches_one_process_and_resumes_on_cp1(single, cache_dir, tmp_path):
    from trainkit import cli_args, losses, records, torchrun_train

    from tapa.train.trainer import train

    saved = tmp_path / "cp2"
    torchrun_train(2, cli_args(*_configs(saved, cache_dir)) + ["--cp", "2", "--stop-after", "3"])
    assert _close(losses(saved), losses(single)[:3]), (losses(saved), losses(single))
    run_config = json.loads((saved / "config.json").read_text())
    assert (run_config["world_size"], run_config["context_parallel"]) == (2, 2)
    val = [r["val_loss"] for r in records(saved)]
    assert abs(val[2] - records(single)[2]["val_loss"]) <= E2E_TOLERANCE

    on_one = tmp_path / "resume-cp1"
    shutil.copytree(saved, on_one)
    train(*_configs(on_one, cache_dir, cp=1, resume=True))
    assert _close(losses(on_one), losses(single)), (losses(on_one), losses(single))


def test_a_cp1_checkpoint_resumes_on_cp2(single, cache_dir, tmp_path):
    from trainkit import losses, torchrun_train

    from tapa.train.trainer import train

    run = tmp_path / "cp1"
    train(*_configs(run, cache_dir, stop_after=3))
    torchrun_train(2, ["--run-dir", str(run), "--resume", "--no-progress", "--cp", "2"])
    assert _close(losses(run), losses(single)), (losses(run), losses(single))
