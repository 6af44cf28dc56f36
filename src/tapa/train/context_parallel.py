"""Context parallelism (CP) for training: every row of a batch is cut across the ranks of a
context group, so that no rank holds a whole long row's activations.

PyTorch's own context parallel patches SDPA only; TAPA's needs no patching, because its op takes
the global positions of its queries and keys (`tapa_attention(q_offset=, k_offset=)`), and so do
the local sliding-window op and RoPE. Built on torch.distributed alone (a DeviceMesh, collectives
and point-to-point sends), as torchtitan builds its FlexAttention CP.

Mesh. W processes form a (dp, cp) DeviceMesh, context fastest: rank = dp_rank * cp + cp_rank.
The ranks of one data group (same dp_rank) read the same rows; the data parallelism (DDP or
FSDP2) spans all W ranks, since every rank holds the whole model.

Sharding (head-tail load balancing). A row of L tokens is cut into 2 * cp equal chunks of
c = L / (2 cp); rank r holds chunks r and 2 cp - 1 - r, in that order: [chunk r | chunk 2cp-1-r].
Under a causal mask a chunk's cost grows with its index, so every rank gets the same work.
L must be a multiple of 2 * cp (ValueError otherwise: choose --seq-len accordingly).

Attention (`ContextShard.attend`, called by `tapa.model.attention.Attention` through
`AttentionContext.parallel`); each local query chunk is one call of the layer's own attention at
its global positions (`Attention.attend_span`):
- global layers (TAPA, NoPE, RoPE family): K and V are all-gathered over the context group (their
  gradients reduce-scattered back in the backward: `_GatherSequence`), and chunk j's queries
  attend keys 0 .. (j + 1) c - 1, causal by global position (TAPA: the op with q_offset = j c,
  k_offset = 0; softmax: SDPA with the causal mask by position);
- local layers (window w): a chunk needs only the w - 1 keys before it, so no gather: a halo
  exchange (`_HaloExchange`) sends each chunk's last keys/values to the owner of the next chunk
  (and, when w - 1 is longer than a chunk, further on), point to point; gradients flow back the
  same way.
RoPE rotates each token at its global position, with the frequencies of the whole row's length.

Packed documents (`shard(documents=)`, `tapa train --cp N --doc-mask`): the labels of the whole
rows travel with the shard (every rank reads the whole rows, so no exchange is needed), and every
span gets its keys' labels (`tapa.model.attention.SpanDocuments`): local and softmax global layers
mask other documents' keys (the sliding-window op with document labels), TAPA global layers run
each document's queries against that document's keys through the varlen op, bottom-right aligned
(a document cut by a chunk boundary keeps its distances). RoPE positions restart at each
document, as in one process, with frequencies of the whole row's positions.

Loss. Each rank scores its own tokens; `ContextShard.mean_loss` sums the ranks' cross-entropy
sums and token counts over the whole mesh (context and data), so every rank returns the loss of
the one-process run over the same rows. Its backward seeds each rank's tokens with
(sum of the ranks' incoming gradients) / tokens, i.e. W / tokens when every rank backpropagates
the same loss: the data-parallel wrapper then averages the gradients over the W ranks, which
gives exactly the one-process gradient.

Not supported (ValueError): padding masks, KV caches.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from tapa.model.attention import Documents, SpanDocuments

# torch 2.13 renamed the tensor collectives (the old names warn); 2.11 has only the old ones
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


# ---------------------------------------------------------------------------------------------
# Geometry: which chunks a rank holds (pure functions, no process group)

def rank_chunks(cp: int, rank: int) -> tuple[int, int]:
    """The two chunks (of 2 cp) that context rank `rank` holds, in its local order."""
    return rank, 2 * cp - 1 - rank


def chunk_owner(chunk: int, cp: int) -> tuple[int, int]:
    """(rank, slot): who holds chunk `chunk` and whether it is that rank's first (0) or second (1)."""
    return (chunk, 0) if chunk < cp else (2 * cp - 1 - chunk, 1)


def check_length(length: int, cp: int) -> int:
    """The chunk length of rows of `length` tokens under CP size cp; ValueError unless 2 cp divides
    the length."""
    if length % (2 * cp) or length == 0:
        raise ValueError(f"context parallelism over {cp} ranks cuts each row into 2 x {cp} = "
                         f"{2 * cp} equal chunks (head-tail load balancing), but the row length "
                         f"{length} is not a multiple of {2 * cp}; choose a --seq-len that is")
    return length // (2 * cp)


def shard_positions(length: int, cp: int, rank: int, device=None) -> torch.Tensor:
    """(2 c,) int64: the global positions of the tokens context rank `rank` holds."""
    chunk = check_length(length, cp)
    return torch.cat([torch.arange(j * chunk, (j + 1) * chunk, device=device)
                      for j in rank_chunks(cp, rank)])


def shard_sequence(x: torch.Tensor, cp: int, rank: int, dim: int = 1) -> torch.Tensor:
    """Rank `rank`'s share of x along `dim` (the sequence): chunks r and 2 cp - 1 - r."""
    chunk = check_length(x.shape[dim], cp)
    return torch.cat([x.narrow(dim, j * chunk, chunk) for j in rank_chunks(cp, rank)], dim=dim)


def unshard_sequence(shards, dim: int = 1) -> torch.Tensor:
    """The whole sequence from every context rank's share (a list in rank order)."""
    cp = len(shards)
    halves = [shard.chunk(2, dim=dim) for shard in shards]
    return torch.cat([halves[owner][slot] for owner, slot in
                      (chunk_owner(j, cp) for j in range(2 * cp))], dim=dim)


# ---------------------------------------------------------------------------------------------
# Collectives with gradients

class _GatherSequence(torch.autograd.Function):
    """All-gather of x (S, B, n, ...) over the context group into (cp, S, B, n, ...); the
    backward reduce-scatters (sums) the gradient back to each rank's own share."""

    @staticmethod
    def forward(ctx, x, group, cp):
        ctx.group, ctx.cp = group, cp
        x = x.contiguous()
        out = x.new_empty((cp * x.shape[0], *x.shape[1:]))
        _all_gather(out, x, group=group)
        return out.view(cp, *x.shape)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        out = grad.new_empty(grad.shape[1:])
        _reduce_scatter(out, grad.flatten(0, 1), op=dist.ReduceOp.SUM, group=ctx.group)
        return out, None, None


@dataclass(frozen=True)
class _Piece:
    """`length` keys at local offset `src_start` of rank `src` that fill the halo of rank `dst`
    at offset `dst_start` of its halo buffer."""

    src: int
    src_start: int
    dst: int
    dst_start: int
    length: int


def halo_plan(cp: int, chunk: int, halo: int) -> tuple[list[_Piece], dict[int, tuple[int, int]]]:
    """Who sends which keys to whom, for `halo` keys before every chunk.

    A rank's halo buffer is its first chunk's halo then its second's; returns the pieces (in one
    order every rank agrees on) and, per rank, the lengths of its two halos (short at the row's
    start)."""
    pieces, lengths = [], {}
    for dst in range(cp):
        offset, sizes = 0, []
        for j in rank_chunks(cp, dst):
            start = j * chunk
            first = max(0, start - halo)
            position = first
            while position < start:
                source = position // chunk
                end = min(start, (source + 1) * chunk)
                src, slot = chunk_owner(source, cp)
                pieces.append(_Piece(src, slot * chunk + position - source * chunk, dst,
                                     offset + position - first, end - position))
                position = end
            sizes.append(start - first)
            offset += start - first
        lengths[dst] = (sizes[0], sizes[1])
    return pieces, lengths


def _exchange(sends: dict[int, torch.Tensor], recvs: dict[int, torch.Tensor], group) -> None:
    """Point-to-point: sends[peer] to each peer, recvs[peer] from each (context-group ranks)."""
    ops = [dist.P2POp(dist.isend, tensor.contiguous(), dist.get_global_rank(group, peer), group)
           for peer, tensor in sorted(sends.items())]
    ops += [dist.P2POp(dist.irecv, tensor, dist.get_global_rank(group, peer), group)
            for peer, tensor in sorted(recvs.items())]
    if ops:
        for work in dist.batch_isend_irecv(ops):
            work.wait()


class _HaloExchange(torch.autograd.Function):
    """x (S, B, n, ...) -> this rank's halo buffer (S, B, h0 + h1, ...): the keys before each of its
    chunks (`halo_plan`), from whichever ranks hold them. The backward sends the halo's gradient
    back and adds it to the keys it came from."""

    @staticmethod
    def forward(ctx, x, pieces, lengths, rank, group):
        ctx.pieces, ctx.rank, ctx.group, ctx.shape = pieces, rank, group, x.shape
        halo = x.new_empty((x.shape[0], x.shape[1], sum(lengths), *x.shape[3:]))
        sends: dict[int, list] = {}
        incoming: dict[int, list] = {}
        for piece in pieces:
            if piece.src == rank and piece.dst == rank:
                halo[:, :, piece.dst_start:piece.dst_start + piece.length] = \
                    x[:, :, piece.src_start:piece.src_start + piece.length]
            elif piece.src == rank:
                sends.setdefault(piece.dst, []).append(x[:, :, piece.src_start:piece.src_start + piece.length])
            elif piece.dst == rank:
                incoming.setdefault(piece.src, []).append(piece)
        recvs = {src: x.new_empty((x.shape[0], x.shape[1], sum(p.length for p in parts), *x.shape[3:]))
                 for src, parts in incoming.items()}
        _exchange({dst: torch.cat(parts, dim=2) for dst, parts in sends.items()}, recvs, group)
        for src, parts in incoming.items():
            offset = 0
            for piece in parts:
                halo[:, :, piece.dst_start:piece.dst_start + piece.length] = \
                    recvs[src][:, :, offset:offset + piece.length]
                offset += piece.length
        return halo

    @staticmethod
    def backward(ctx, grad):
        rank = ctx.rank
        grad_x = grad.new_zeros(ctx.shape)
        sends: dict[int, list] = {}
        returning: dict[int, list] = {}
        for piece in ctx.pieces:
            if piece.src == rank and piece.dst == rank:
                grad_x[:, :, piece.src_start:piece.src_start + piece.length] += \
                    grad[:, :, piece.dst_start:piece.dst_start + piece.length]
            elif piece.dst == rank:
                sends.setdefault(piece.src, []).append(grad[:, :, piece.dst_start:piece.dst_start + piece.length])
            elif piece.src == rank:
                returning.setdefault(piece.dst, []).append(piece)
        recvs = {dst: grad.new_empty((grad.shape[0], grad.shape[1], sum(p.length for p in parts),
                                      *grad.shape[3:]))
                 for dst, parts in returning.items()}
        _exchange({src: torch.cat(parts, dim=2) for src, parts in sends.items()}, recvs, ctx.group)
        for dst, parts in returning.items():
            offset = 0
            for piece in parts:
                grad_x[:, :, piece.src_start:piece.src_start + piece.length] += \
                    recvs[dst][:, :, offset:offset + piece.length]
                offset += piece.length
        return grad_x, None, None, None, None


class _MeanLoss(torch.autograd.Function):
    """(sum, tokens) of every rank of `group` -> sum / tokens on each; see the module docstring
    for the backward."""

    @staticmethod
    def forward(ctx, total, count, group):
        both = torch.stack([total.detach().to(torch.float64), count.to(torch.float64)])
        dist.all_reduce(both, group=group)
        ctx.group, ctx.tokens, ctx.dtype = group, both[1].clamp_min(1), total.dtype
        return (both[0] / ctx.tokens).to(total.dtype)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.detach().to(torch.float64).clone()
        dist.all_reduce(grad, group=ctx.group)
        return (grad / ctx.tokens).to(ctx.dtype), None, None


# ---------------------------------------------------------------------------------------------
# The run's mesh and one batch's shard

class ContextParallel:
    """The (dp, cp) mesh of a run and its groups; `shard` cuts a batch for this rank.

    Call on every rank of an initialized default process group whose size is a multiple of cp.
    """

    def __init__(self, cp: int, device_type: str):
        from torch.distributed.device_mesh import init_device_mesh

        if not isinstance(cp, int) or isinstance(cp, bool) or cp < 1:
            raise ValueError(f"cp must be a positive int, got {cp!r}")
        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        if world % cp:
            raise ValueError(f"--cp {cp} needs a multiple of {cp} processes (torchrun "
                             f"--nproc-per-node), got {world}")
        self.cp, self.dp = cp, world // cp
        self.mesh = init_device_mesh(device_type, (self.dp, cp), mesh_dim_names=("dp", "cp"))
        self.group = self.mesh.get_group("cp")
        self.cp_rank = self.mesh.get_local_rank("cp")
        self.dp_rank = self.mesh.get_local_rank("dp")
        # the loss reduction has its own communicator (the data-parallel wrapper's is the world's)
        self.loss_group = self.mesh["dp", "cp"]._flatten("dp_cp").get_group()

    def shard(self, inputs: torch.Tensor, targets: torch.Tensor | None = None,
              documents: Documents | torch.Tensor | None = None):
        """(inputs, targets, shard) of this rank from whole rows (B, L): its two chunks of each, and
        the `ContextShard` to pass to the model (`TapaLM(..., context_parallel=shard)`).
        documents: the whole rows' packed documents (a `Documents`, or labels (B, L) equal within
        a document), so that no token attends across one."""
        length = inputs.shape[1]
        local = shard_sequence(inputs, self.cp, self.cp_rank)
        local_targets = shard_sequence(targets, self.cp, self.cp_rank) if targets is not None else None
        if documents is not None and not isinstance(documents, Documents):
            documents = Documents.from_ids(documents.to(inputs.device))
        if documents is not None and tuple(documents.ids.shape) != tuple(inputs.shape):
            raise ValueError(f"documents must label the whole rows {tuple(inputs.shape)}, got "
                             f"{tuple(documents.ids.shape)}")
        return local, local_targets, ContextShard(self, length, inputs.device, documents)

    def unshard(self, local: torch.Tensor, dim: int = 1) -> torch.Tensor:
        """The whole rows from every context rank's share (a collective; for tests, no gradient)."""
        parts = [torch.empty_like(local) for _ in range(self.cp)]
        dist.all_gather(parts, local.contiguous(), group=self.group)
        return unshard_sequence(parts, dim=dim)


class ContextShard:
    """This rank's share of one batch's rows, as the model sees it (`AttentionContext.parallel`).

    positions: (2 c,) global positions of the local tokens; length: the whole row's length;
    documents: the whole rows' packed documents (`Documents`) or None, and then
    document_positions (B, 2 c): each local token's position inside its document.
    """

    def __init__(self, parallel: ContextParallel, length: int, device,
                 documents: Documents | None = None):
        self.parallel, self.length, self.documents = parallel, length, documents
        self.chunk = check_length(length, parallel.cp)
        self.positions = shard_positions(length, parallel.cp, parallel.cp_rank, device)
        self.document_positions = (shard_sequence(documents.positions, parallel.cp, parallel.cp_rank)
                                   if documents is not None else None)
        self._halo_plans: dict[int, tuple] = {}
        self._spans: dict[tuple[int, int], SpanDocuments] = {}  # (first key, end) -> its labels

    def _span_documents(self, k_offset: int, end: int) -> SpanDocuments | None:
        """The labels of the keys k_offset .. end - 1 of every row, made once a pass (the layers
        share them, and what each derives from them)."""
        if self.documents is None:
            return None
        if (k_offset, end) not in self._spans:
            self._spans[k_offset, end] = SpanDocuments(self.documents.ids[:, k_offset:end])
        return self._spans[k_offset, end]

    def _gather(self, kv: torch.Tensor) -> torch.Tensor:
        """kv (S, B, 2c, ...) of every rank -> (S, B, L, ...) in global order."""
        cp, chunk = self.parallel.cp, self.chunk
        gathered = _GatherSequence.apply(kv, self.parallel.group, cp)  # (cp, S, B, 2c, ...)
        gathered = gathered.unflatten(3, (2, chunk))  # (cp, S, B, slot, c, ...)
        firsts = gathered[:, :, :, 0].movedim(0, 2)  # (S, B, cp, c, ...): chunks 0 .. cp-1
        seconds = gathered[:, :, :, 1].flip(0).movedim(0, 2)  # chunks cp .. 2cp-1
        return torch.cat([firsts, seconds], dim=2).flatten(2, 3)

    def _halo(self, kv: torch.Tensor, halo: int) -> tuple[torch.Tensor, tuple[int, int]]:
        if halo not in self._halo_plans:
            self._halo_plans[halo] = halo_plan(self.parallel.cp, self.chunk, halo)
        pieces, lengths = self._halo_plans[halo]
        rank = self.parallel.cp_rank
        buffer = _HaloExchange.apply(kv, pieces, lengths[rank], rank, self.parallel.group)
        return buffer, lengths[rank]

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, span, window=None):
        """Attention of the local queries q (B, 2c, H, D) given the local keys/values k, v
        (B, 2c, Hk, D): `span(q, k, v, q_offset, k_offset, documents=)` per local chunk, against
        the gathered keys (global layers, window None) or the chunk's window (local layers);
        documents: the keys' labels when the rows are packed documents, else None."""
        chunk = self.chunk
        starts = [j * chunk for j in rank_chunks(self.parallel.cp, self.parallel.cp_rank)]
        kv = torch.stack([k, v])
        outs = []
        if window is None:
            keys = self._gather(kv)
            for slot, start in enumerate(starts):
                end = start + chunk
                outs.append(span(q[:, slot * chunk:(slot + 1) * chunk], keys[0][:, :end],
                                 keys[1][:, :end], start, 0,
                                 documents=self._span_documents(0, end)))
        else:
            buffer, lengths = self._halo(kv, window - 1) if window > 1 else (None, (0, 0))
            offset = 0
            for slot, start in enumerate(starts):
                own = kv[:, :, slot * chunk:(slot + 1) * chunk]
                if lengths[slot]:
                    own = torch.cat([buffer[:, :, offset:offset + lengths[slot]], own], dim=2)
                offset += lengths[slot]
                first = start - lengths[slot]
                outs.append(span(q[:, slot * chunk:(slot + 1) * chunk], own[0], own[1], start,
                                 first, documents=self._span_documents(first, start + chunk)))
        return torch.cat(outs, dim=1)

    def mean_loss(self, total: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
        """The mean over every rank's tokens of the mesh (see the module docstring)."""
        return _MeanLoss.apply(total, count, self.parallel.loss_group)
