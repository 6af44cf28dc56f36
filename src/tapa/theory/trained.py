"""Theory on trained weights: the attention logit's mean and variance vs distance, computed from a
trained layer's actual q and k on held-out text, next to the iid theory of `tapa.theory`.

    python3 -m tapa.theory.trained RUN_DIR [RUN_DIR ...] --layer 3 --seq-len 2048 --sequences 8 \
        --out results/toy-study/theory-trained

For each run, `sequences` windows of `seq_len` held-out tokens go through the model; the layer's
q and k are captured (`capture_qk`) and turned into the logits its attention uses (`layer_logits`):
    TAPA        tapa.ops.tapa.reference.tapa_logits (the learnable phase matrix, if any, applied to q)
    RoPE family (R_m q_m) . (R_n k_n) / sqrt(D), the model's own rotary tables (YaRN's factor too)
    NoPE        q_m . k_n / sqrt(D)
Causal pairs (m >= n) are binned by distance m - n: 0 alone, then log-spaced bins up to seq_len.
Per bin: the mean and variance of the logit ("trained") and of the logit minus its query's mean
over its causal keys ("trained-centered": softmax ignores a per-query shift, so this is the part
of a distance bias that can change attention). Two iid references at each bin's mean distance:
- "iid-empirical": q and k drawn independently from the captured ones (any position, sequence and
  head): the paper's iid assumption with the model's own marginals;
- "iid-gaussian": `tapa.theory.monte_carlo.exact_moments` for Gaussian q, k whose amplitude and
  phase parts have the captured means and stds (TAPA and RoPE only).
A local sliding-window layer of a hybrid (layer_pattern "L") is plain RoPE inside its window; pairs
beyond the window are not binned.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
from pathlib import Path

import numpy as np
import torch

from tapa.ops.tapa.reference import tapa_logits
from tapa.theory.monte_carlo import TheoryConfig, exact_moments

CSV_FIELDS = ("run", "label", "layer", "kind", "estimate", "head", "bin_start", "bin_end", "distance",
              "count", "mean", "var", "mean_se")


class _Captured(Exception):
    """Stops the forward pass once the layer's input is captured (later layers are not needed)."""


def capture_qk(model, layer: int, input_ids: torch.Tensor):
    """q (B, N, H, D) and k (B, N, Hk, D) of `layer` for input_ids (B, N), before rotation: the
    layer's attention input, captured by a pre-hook, through `Attention.project`."""
    attention = model.layers[layer].attn
    captured = {}

    def hook(module, args, kwargs):
        captured["x"] = args[0] if args else kwargs["x"]
        raise _Captured

    handle = attention.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        with torch.no_grad():
            model(input_ids)
    except _Captured:
        pass
    finally:
        handle.remove()
    with torch.no_grad():
        q, k, _ = attention.project(captured["x"])
    return q.float(), k.float()


def layer_kind(model, layer: int) -> tuple[str, int | None]:
    """("tapa" | "rope" | "nope" | "local-rope", window or None): how the layer attends."""
    attention = model.layers[layer].attn
    if attention.local:
        return "local-rope", int(attention.window)
    return attention.family, None


def prepare_qk(model, layer: int, q: torch.Tensor, k: torch.Tensor, q_start: int = 0, k_start: int = 0):
    """q and k as the layer's attention op receives them, for queries at positions q_start..
    and keys at k_start..: rotated with the model's own tables (RoPE family, local layers), the
    learnable phase matrix folded into q (TAPA), unchanged (NoPE)."""
    from tapa.model.attention import AttentionContext

    attention = model.layers[layer].attn
    if attention.family == "tapa":
        return attention._apply_phase_matrix(q), k
    if attention.family != "rope":
        return q, k
    rotated = []
    for x, start in ((q, q_start), (k, k_start)):
        ctx = AttentionContext.build(x.shape[0], start, x.shape[1], x.device, cfg=model.config)
        rotated.append(ctx.rotate(x, model.config, attention.local))
    return tuple(rotated)


def pair_logits(model, layer: int, q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor,
                k_pos: torch.Tensor) -> torch.Tensor:
    """Logits (B, H, Nq, Nk) of prepared q (B, Nq, H, D) and k (B, Nk, Hk, D) at positions
    q_pos, k_pos (no mask): `tapa_logits` for TAPA layers, q.k / sqrt(D) for the others."""
    attention = model.layers[layer].attn
    if k.shape[2] != q.shape[2]:
        k = k.repeat_interleave(q.shape[2] // k.shape[2], dim=2)
    if attention.family == "tapa":
        cfg = model.config
        return tapa_logits(q.transpose(1, 2), k.transpose(1, 2), q_pos, k_pos, amp_dim=attention.amp_dim,
                           alpha=cfg.alpha, distance=cfg.distance, phase=cfg.phase)
    return torch.einsum("bmhd,bnhd->bhmn", q, k) / math.sqrt(q.shape[-1])


def layer_logits(model, layer: int, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Logits (B, H, N, N) the layer computes for one sequence's q, k (as `capture_qk` returns
    them, positions 0..N-1), before the causal (and window) mask."""
    positions = torch.arange(q.shape[1], device=q.device)
    with torch.no_grad():
        return pair_logits(model, layer, *prepare_qk(model, layer, q, k), positions, positions)


def distance_bins(seq_len: int, per_decade: int = 8) -> np.ndarray:
    """Bin edges: [0, 1) alone, then log-spaced integer edges from 1 up to seq_len."""
    count = max(2, int(round(math.log10(seq_len) * per_decade)) + 1)
    edges = np.unique(np.round(np.logspace(0, math.log10(seq_len), count)).astype(np.int64))
    return np.concatenate([[0], edges[edges < seq_len], [seq_len]])


def binned_logit_moments(model, layer: int, q: torch.Tensor, k: torch.Tensor, edges: np.ndarray,
                         block: int | None = None) -> dict[str, np.ndarray]:
    """Per head and distance bin, sums over causal pairs: count, sum of the distance, of the logit
    and its square, and of the centered logit and its square. Arrays (H, bins), float64.
    Queries go `block` rows at a time (default: ~32M logits per block)."""
    batch, seq_len, heads, _ = q.shape
    block = block or max(1, (1 << 25) // (batch * heads * seq_len))
    _, window = layer_kind(model, layer)
    bins = len(edges) - 1
    bin_of = torch.as_tensor(np.searchsorted(edges, np.arange(seq_len), side="right") - 1,
                             device=q.device)
    sums = {name: torch.zeros(heads, bins, dtype=torch.float64, device=q.device)
            for name in ("count", "distance", "x", "x2", "c", "c2")}
    keys = torch.arange(seq_len, device=q.device)
    with torch.no_grad():
        q, k = prepare_qk(model, layer, q, k)
        for start in range(0, seq_len, block):
            queries = keys[start:start + block]
            logits = pair_logits(model, layer, q[:, start:start + block], k, queries, keys).float()
            distance = queries[:, None] - keys[None, :]
            visible = distance >= 0
            if window is not None:
                visible &= distance < window
            weight = visible.float()
            query_mean = (logits * weight).sum(-1, keepdim=True) / weight.sum(-1, keepdim=True)
            centered = logits - query_mean
            index = bin_of[distance.clamp(min=0)].expand(heads, -1, -1).reshape(heads, -1)
            for name, values in (("count", torch.ones_like(logits)),
                                 ("distance", distance.float().expand_as(logits)),
                                 ("x", logits), ("x2", logits**2), ("c", centered), ("c2", centered**2)):
                per_head = (values * weight).double().sum(0).reshape(heads, -1)  # summed over the batch
                sums[name].scatter_add_(1, index, per_head)  # invisible pairs add 0
    return {name: value.cpu().numpy() for name, value in sums.items()}


def _rows_from_sums(sums, edges, **fields) -> list[dict]:
    rows = []
    heads = sums["count"].shape[0]
    for head in ["all", *range(heads)]:
        pick = (lambda a: a.sum(0)) if head == "all" else (lambda a, h=head: a[h])
        count = pick(sums["count"])
        for estimate, first, second in (("trained", "x", "x2"), ("trained-centered", "c", "c2")):
            for b in np.nonzero(count)[0]:
                n = count[b]
                mean = pick(sums[first])[b] / n
                var = (pick(sums[second])[b] / n - mean**2) * n / max(n - 1, 1)
                rows.append({**fields, "estimate": estimate, "head": head, "bin_start": int(edges[b]),
                             "bin_end": int(edges[b + 1]), "distance": pick(sums["distance"])[b] / n,
                             "count": int(n), "mean": mean, "var": var, "mean_se": ""})
    return rows


def iid_empirical(model, layer: int, q: torch.Tensor, k: torch.Tensor, distances, samples: int = 20000,
                  seed: int = 0) -> list[dict]:
    """E and Var of the layer's logit at each distance for q and k drawn independently from the
    captured vectors (any sequence, position and head), the query at the distance, the key at 0."""
    gen = torch.Generator().manual_seed(seed)
    if k.shape[2] != q.shape[2]:
        k = k.repeat_interleave(q.shape[2] // k.shape[2], dim=2)
    flat_q = q.reshape(-1, q.shape[-1])
    flat_k = k.reshape(-1, k.shape[-1])
    rows = []
    for distance in distances:
        qi = torch.randint(len(flat_q), (samples,), generator=gen).to(q.device)
        ki = torch.randint(len(flat_k), (samples,), generator=gen).to(q.device)
        # `samples` sequences of one query (at `distance`) and one key (at 0), one head
        one_q, one_k = flat_q[qi][:, None, None, :], flat_k[ki][:, None, None, :]
        with torch.no_grad():
            one_q, one_k = prepare_qk(model, layer, one_q, one_k, q_start=int(distance), k_start=0)
            logits = pair_logits(model, layer, one_q, one_k, torch.tensor([int(distance)], device=q.device),
                                 torch.tensor([0], device=q.device)).reshape(-1).double()
        rows.append({"distance": float(distance), "count": samples, "mean": float(logits.mean()),
                     "var": float(logits.var()), "mean_se": float(logits.std() / math.sqrt(samples))})
    return rows


def fitted_theory(model, layer: int, q: torch.Tensor, k: torch.Tensor) -> TheoryConfig | None:
    """The Gaussian iid setting of tapa.theory with the captured parts' means and stds (the
    amplitude and phase parts for TAPA, the two rotary halves for RoPE); None for NoPE."""
    kind, _ = layer_kind(model, layer)
    if kind == "nope":
        return None
    cfg, attention = model.config, model.layers[layer].attn
    if kind == "tapa":
        q = attention._apply_phase_matrix(q)
    amp = attention.amp_dim if kind == "tapa" else q.shape[-1] // 2
    (q_amp, q_phase), (k_amp, k_phase) = ((t[..., :amp], t[..., amp:]) for t in (q, k))
    return TheoryConfig(head_dim=q.shape[-1], theta=amp / q.shape[-1], alpha=cfg.alpha,
                        rope_base=cfg.rope_base, amp_mean_q=float(q_amp.mean()), amp_mean_k=float(k_amp.mean()),
                        amp_std=float((q_amp.var() + k_amp.var()).div(2).sqrt()),
                        phase_mean_q=float(q_phase.mean()), phase_mean_k=float(k_phase.mean()),
                        phase_std=float((q_phase.var() + k_phase.var()).div(2).sqrt()))


def theory_method(model, layer: int) -> str | None:
    kind, _ = layer_kind(model, layer)
    if kind == "tapa":
        return "tapa" if model.config.phase == "quadratic" else "tapa-linear-phase"
    return "rope" if kind in ("rope", "local-rope") else None


def analyse(model, layer: int, input_ids: torch.Tensor, *, run: str = "", label: str = "",
            iid_samples: int = 20000, per_decade: int = 8) -> list[dict]:
    """All rows (CSV_FIELDS) for one model and layer on held-out input_ids (B, N)."""
    if not 0 <= layer < len(model.layers):
        raise ValueError(f"layer must be in [0, {len(model.layers)}), got {layer}")
    model.eval()
    q, k = capture_qk(model, layer, input_ids)
    edges = distance_bins(input_ids.shape[1], per_decade)
    kind, _ = layer_kind(model, layer)
    fields = {"run": run, "label": label or model.config.label, "layer": layer, "kind": kind}
    rows = _rows_from_sums(binned_logit_moments(model, layer, q, k, edges), edges, **fields)
    distances = sorted({round(r["distance"]) for r in rows if r["head"] == "all"
                        and r["estimate"] == "trained"})
    for row in iid_empirical(model, layer, q, k, distances, samples=iid_samples):
        rows.append({**fields, "estimate": "iid-empirical", "head": "all", "bin_start": "",
                     "bin_end": "", **row})
    config, method = fitted_theory(model, layer, q, k), theory_method(model, layer)
    if config is not None:
        for distance in distances:
            mean, var = exact_moments(method, int(distance), config)
            rows.append({**fields, "estimate": "iid-gaussian", "head": "all", "bin_start": "",
                         "bin_end": "", "distance": float(distance), "count": "", "mean": mean,
                         "var": var, "mean_se": ""})
    return rows


# ---------------------------------------------------------------------------------------------
# files and the command

def write_csv(rows: list[dict], path: Path) -> None:
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=CSV_FIELDS)
        writer.writeheader()
        writer.writerows({key: row.get(key, "") for key in CSV_FIELDS} for row in rows)


_STYLES = {"trained": dict(marker="o", linestyle="-", ms=4), "trained-centered": dict(marker="s", linestyle=":", ms=3),
           "iid-empirical": dict(marker="", linestyle="-", lw=1.0), "iid-gaussian": dict(marker="", linestyle="--", lw=1.0)}


def plot(rows: list[dict], path: Path, title: str = "") -> Path:
    """One row of panels per run: E[logit] and Var[logit] vs distance (log x, distance 0 left out)."""
    from tapa._optional import require

    matplotlib = require("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = list(dict.fromkeys((r["run"], r["label"], r["layer"]) for r in rows))
    fig, axes = plt.subplots(len(runs), 2, figsize=(12, 3.6 * len(runs)), squeeze=False)
    for (run, label, layer), (ax_mean, ax_var) in zip(runs, axes):
        for estimate, style in _STYLES.items():
            mine = sorted((r for r in rows if (r["run"], r["label"], r["layer"]) == (run, label, layer)
                           and r["estimate"] == estimate and r["head"] == "all" and r["distance"] >= 1),
                          key=lambda r: r["distance"])
            if mine:
                x = [r["distance"] for r in mine]
                ax_mean.plot(x, [r["mean"] for r in mine], label=estimate, **style)
                ax_var.plot(x, [r["var"] for r in mine], label=estimate, **style)
        for ax, what in ((ax_mean, "E[logit]"), (ax_var, "Var[logit]")):
            ax.set_xscale("log")
            ax.set_xlabel("distance m - n")
            ax.set_title(f"{label} ({run}), layer {layer}: {what}", fontsize=9)
            ax.grid(alpha=0.3)
        ax_mean.axhline(0, color="black", lw=0.6)
        ax_mean.legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def held_out_windows(run_dir: str, seq_len: int, sequences: int, split: str = "test") -> torch.Tensor:
    """`sequences` windows of seq_len tokens spread evenly over the run's held-out split."""
    from tapa.data import DataConfig, build_corpus

    config = json.loads((Path(run_dir) / "config.json").read_text())
    tokens = build_corpus(DataConfig.from_dict(config["data"]), progress=False).tokens(split)
    if len(tokens) < seq_len * sequences:
        raise ValueError(f"the {split} split has {len(tokens)} tokens, fewer than "
                         f"{sequences} x {seq_len}; lower --sequences or --seq-len")
    starts = np.linspace(0, len(tokens) - seq_len, sequences).astype(np.int64)
    return torch.from_numpy(np.stack([np.asarray(tokens[s:s + seq_len], dtype=np.int64) for s in starts]))


def middle_global_layer(model) -> int:
    """The middle one of the model's global layers (a hybrid's local layers never reach far)."""
    layers = [i for i in range(len(model.layers)) if not model.layers[i].attn.local]
    return (layers or list(range(len(model.layers))))[len(layers) // 2]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python3 -m tapa.theory.trained", description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR")
    parser.add_argument("--layer", type=int, default=None,
                        help="layer index (default: the middle of the global layers)")
    parser.add_argument("--seq-len", type=int, default=None, help="default: each run's training length")
    parser.add_argument("--sequences", type=int, default=8)
    parser.add_argument("--split", choices=("val", "test"), default="test")
    parser.add_argument("--iid-samples", type=int, default=20000)
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    parser.add_argument("--out", type=Path, default=Path("results/toy-study/theory-trained"))
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from tapa.model.loading import load_model

    device = "cpu" if args.device == "cuda" and not torch.cuda.is_available() else args.device
    rows = []
    for run_dir in args.runs:
        model, model_cfg, run_config = load_model(run_dir, device=device)
        layer = middle_global_layer(model) if args.layer is None else args.layer
        seq_len = args.seq_len or int(run_config["train"]["seq_len"])
        ids = held_out_windows(run_dir, seq_len, args.sequences, args.split).to(device)
        name = "/".join(Path(run_dir).resolve().parts[-2:])
        rows += analyse(model, layer, ids, run=name, label=model_cfg.label, iid_samples=args.iid_samples)
        print(f"{run_dir}: layer {layer} ({layer_kind(model, layer)[0]}), {args.sequences} x {seq_len} tokens")
    args.out.mkdir(parents=True, exist_ok=True)
    write_csv(rows, args.out / "theory_trained.csv")
    plot(rows, args.out / "theory_trained.png",
         title="logit moments vs distance: trained q/k against the iid theory")
    print(f"wrote {args.out / 'theory_trained.csv'} ({len(rows)} rows) and {args.out / 'theory_trained.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
