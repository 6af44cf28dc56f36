"""`tapa bench model`: training throughput (tokens/s) and MFU of a ~125M-parameter decoder,
TAPA (fused kernel through attn_impl="auto"), the TAPA hybrid (three of four layers local
sliding-window RoPE on FlexAttention, every fourth global TAPA) and RoPE
(F.scaled_dot_product_attention forced to the FLASH_ATTENTION backend), at several context
lengths, in one process.

One training step = forward, float32 cross-entropy, backward, fused AdamW step, under bf16
autocast, on random token ids (the data does not change the work). Each configuration runs
`warmup` untimed steps (compilation, autotuning) and then `steps` timed ones.

Model FLOPs per token (the PaLM convention, causal attention counted once):
    6 * N_matmul + 6 * sum over layers of (seq_len, or min(seq_len, local_window) in local layers) * dim
where N_matmul counts the weights that multiply activations (all but the embedding lookup; a tied
lm_head counts). MFU = achieved model FLOP/s / peak bf16 dense FLOP/s of the GPU.

    tapa bench model                     # H200: 2k, 8k, 32k; writes runs/bench/model-throughput-h200/
    tapa bench model --cpu-smoke --out /tmp/smoke    # the same logic, tiny, on CPU
"""

from __future__ import annotations

import argparse
import csv
import gc
import datetime
import platform
import re
import shlex
import time
from contextlib import nullcontext
from pathlib import Path

import torch

from tapa.model import Documents, ModelConfig, TapaLM

# bf16 dense peak TFLOP/s (no sparsity), by a substring of torch.cuda.get_device_name()
PEAK_BF16_TFLOPS = {"H200": 989.4, "H100": 989.4, "A100": 312.0, "L40S": 362.1, "A10G": 125.0}

BENCH_MODEL = dict(dim=768, n_layers=12, n_heads=6, vocab_size=50304)  # head_dim 128, ~124M params
SMOKE_MODEL = dict(dim=64, n_layers=4, n_heads=2, vocab_size=512)  # 4 layers: LLLG has its global one
FIELDS = ("model", "pe", "attention", "seq_len", "batch", "checkpointing", "doc_mask", "params_m", "step_ms", "tokens_per_s",
          "tflops", "mfu", "peak_mem_gib", "tapa_over_rope")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--lengths", type=int, nargs="+", default=[2048, 8192, 32768],
                        help="context lengths (default: 2048 8192 32768)")
    parser.add_argument("--tokens-per-step", type=int, default=32768,
                        help="tokens per training step; batch = this // seq_len (default 32768)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per config (default 3)")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per config (default 10)")
    parser.add_argument("--pes", nargs="+", default=["tapa", "tapa:LLLG:256", "rope"],
                        help="models: a positional encoding, or PE:LAYER_PATTERN:LOCAL_WINDOW for a "
                             "hybrid (default: tapa tapa:LLLG:256 rope)")
    parser.add_argument("--compile", action="store_true", help="torch.compile the decoder blocks")
    parser.add_argument("--doc-mask", type=int, default=0, metavar="MEAN_LEN",
                        help="pack each row with documents of random lengths (exponential, this "
                             "mean, a fixed seed) and train with document masking; 0: off")
    parser.add_argument("--checkpointing", type=parse_checkpointing, default=(False,),
                        help="activation checkpointing (TapaLM.checkpoint_blocks): off, on (every "
                             "block), both (off and on), or a comma list of off, on and block "
                             "counts N (the first N blocks, selective), e.g. off,6,on; each config "
                             "is timed once per setting (default off)")
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="peak bf16 TFLOP/s for MFU (default: looked up from the GPU name)")
    parser.add_argument("--out", default=None,
                        help="output directory for results.csv and README.md (default: "
                             "runs/bench/model-throughput-<gpu>, e.g. -h200; with --cpu-smoke: "
                             "runs/bench/model-cpu-smoke)")
    parser.add_argument("--cpu-smoke", action="store_true",
                        help="a tiny float32 run on CPU that exercises the same code (for tests)")


def parse_checkpointing(text: str) -> tuple:
    """--checkpointing: off | on | both | a comma list of off, on and block counts ->
    TapaLM.checkpoint_blocks values (False, True, n)."""
    named = {"off": (False,), "on": (True,), "both": (False, True)}
    if text in named:
        return named[text]
    values = []
    for item in text.split(","):
        if item in ("off", "on"):
            values.append(item == "on")
        elif item.isdigit() and int(item) > 0:
            values.append(int(item))
        else:
            raise argparse.ArgumentTypeError(f"{item!r} is not off, on or a positive block count")
    return tuple(values)


def checkpointing_name(value: bool | int) -> str:
    """A --checkpointing value as the flag spells it: off, on, or a block count."""
    return ("on" if value else "off") if type(value) is bool else str(value)


def matmul_params(model: TapaLM) -> int:
    """Weights that multiply activations: everything except the embedding lookup (a tied
    lm_head still multiplies, so it counts)."""
    total = model.num_parameters()
    if not model.config.tie_embeddings:
        total -= model.embed.weight.numel()
    return total


def flops_per_token(model: TapaLM, seq_len: int, documents: Documents | None = None) -> float:
    """Training FLOPs a token: the matmuls' 6 N, and 6 x span x dim a layer for attention, where
    a causal global layer's span is seq_len (a query sees (seq_len + 1) / 2 keys on average, two
    matmuls) and a local layer's the window. With packed documents a global layer's span is the
    documents' sum of n^2 over the tokens (each document a causal row of its own), and a local
    layer's at most that: the FLOPs the mask keeps."""
    cfg = model.config
    span = float(seq_len)
    if documents is not None:
        lengths = documents.cu_seqlens.diff().double()
        span = float((lengths ** 2).sum() / lengths.sum())
    attended = sum(min(span, cfg.local_window) if cfg.layer_kind(i) == "local" else span
                   for i in range(cfg.n_layers))
    return 6.0 * matmul_params(model) + 6.0 * attended * cfg.dim


def parse_variant(spec: str) -> dict:
    """"tapa" -> {pe}; "tapa:LLLG:256" -> {pe, layer_pattern, local_window}."""
    parts = spec.split(":")
    if len(parts) == 1:
        return {"pe": spec}
    if len(parts) != 3 or not parts[2].isdigit():
        raise ValueError(f"--pes: expected PE or PE:LAYER_PATTERN:LOCAL_WINDOW, got {spec!r}")
    return {"pe": parts[0], "layer_pattern": parts[1], "local_window": int(parts[2])}


def attention_path(cfg: ModelConfig, device: torch.device, documents: bool = False) -> str:
    """What computes the global layers' attention: "tapa-triton", "tapa-reference", "sdpa-flash",
    "sdpa", or with packed documents (documents=True) for softmax layers "flex-documents" (CUDA)
    or "chunked-documents" (the model's document-masked window as long as the row)."""
    if cfg.is_hybrid:
        plain = ModelConfig(**{**cfg.to_dict(), "layer_pattern": "G"})
        return "local+" + attention_path(plain, device, documents)
    if cfg.family != "tapa":
        if documents:
            return "flex-documents" if device.type == "cuda" else "chunked-documents"
        return "sdpa-flash" if device.type == "cuda" else "sdpa"
    from tapa.ops.tapa import _triton_backend

    backend = _triton_backend()
    if backend is None or device.type != "cuda":
        return "tapa-reference"
    probe = torch.empty(1, 16, cfg.n_heads, cfg.head_dim, device=device, dtype=torch.bfloat16)
    return "tapa-triton" if backend.supports(probe, probe, probe, theta=cfg.theta) else "tapa-reference"


def _sdpa_context(path: str):
    if path.endswith("sdpa-flash"):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        return sdpa_kernel([SDPBackend.FLASH_ATTENTION])
    return nullcontext()


def document_ids(batch: int, seq_len: int, mean_len: int, device, seed: int = 0) -> torch.Tensor:
    """(batch, seq_len) labels of packed documents whose lengths are exponential with this mean
    (at least 1 token), drawn with a fixed seed: every config times the same packing."""
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(batch):
        lengths, total = [], 0
        while total < seq_len:
            n = max(1, int(torch.empty(1).exponential_(1 / mean_len, generator=gen)))
            lengths.append(min(n, seq_len - total))
            total += lengths[-1]
        rows.append(torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths)))
    return torch.stack(rows).to(device)


def new_model(cfg: ModelConfig, device: torch.device, *, checkpointing: bool | int = False,
              compile_model: bool = False) -> tuple[TapaLM, torch.optim.Optimizer]:
    """A fresh model (seed 0: the same weights in every process) on `device`, and its AdamW
    (fused on CUDA); checkpointing: TapaLM.checkpoint_blocks (True, False or a block count)."""
    torch.manual_seed(0)
    model = TapaLM(cfg).to(device)
    model.checkpoint_blocks = checkpointing
    if compile_model:
        for block in model.layers:
            block.compile()
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")


def training_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, path: str,
                  device: torch.device, *inputs, **forward):
    """A closure that runs one training step, `model(*inputs, **forward)` (the loss) under bf16
    autocast on CUDA, its backward and the optimizer step, and returns the loss."""
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else nullcontext()

    def step():
        # the backward inside the backend context too: with checkpointing it recomputes the
        # forward, which must take the same SDPA backend (its saved tensors' shapes differ)
        with _sdpa_context(path):
            with autocast:
                loss = model(*inputs, **forward)
            loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    return step


def time_steps(step, *, warmup: int, steps: int, device: torch.device) -> tuple[float, torch.Tensor]:
    """(seconds per step, last loss) of `steps` timed calls of `step` after `warmup` untimed ones
    (compilation, autotuning); CUDA's peak-memory counter is reset first."""
    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    for _ in range(warmup):
        step()
    sync()
    start = time.perf_counter()
    for _ in range(steps):
        loss = step()
    sync()
    return (time.perf_counter() - start) / steps, loss


def measure(cfg: ModelConfig, *, seq_len: int, batch: int, warmup: int, steps: int,
            device: torch.device, compile_model: bool = False, checkpointing: bool = False,
            doc_mask: int = 0) -> dict:
    """Time `steps` training steps of a fresh model (the loss by the model's chunked
    cross-entropy, as training computes it); returns the measured row (no MFU)."""
    model, optimizer = new_model(cfg, device, checkpointing=checkpointing, compile_model=compile_model)
    path = attention_path(cfg, device, documents=bool(doc_mask))
    tokens = torch.randint(0, cfg.vocab_size, (batch, seq_len + 1), device=device)
    documents = Documents.from_ids(document_ids(batch, seq_len, doc_mask, device)) if doc_mask else None
    step = training_step(model, optimizer, path, device, tokens[:, :-1], targets=tokens[:, 1:],
                         document_ids=documents)
    step_s, loss = time_steps(step, warmup=warmup, steps=steps, device=device)
    if not torch.isfinite(loss):
        raise RuntimeError(f"non-finite loss in the {cfg.pe} benchmark at seq_len {seq_len}")
    row = {
        "model": f"{cfg.dim}d x {cfg.n_layers}L x {cfg.n_heads}h", "pe": cfg.label, "attention": path,
        "seq_len": seq_len, "batch": batch, "checkpointing": checkpointing, "doc_mask": doc_mask,
        "params_m": round(model.num_parameters() / 1e6, 1),
        "step_ms": round(1e3 * step_s, 2), "tokens_per_s": round(batch * seq_len / step_s, 1),
        "tflops": float(f"{batch * seq_len * flops_per_token(model, seq_len, documents) / step_s / 1e12:.4g}"),
        "peak_mem_gib": (round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
                         if device.type == "cuda" else None),
    }
    del model, optimizer, step
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return row


def run_benchmark(*, model_kwargs: dict, lengths: list[int], pes: list[str], tokens_per_step: int,
                  warmup: int, steps: int, device: torch.device, peak_tflops: float | None,
                  compile_model: bool = False, progress: bool = True, on_row=None,
                  checkpointing: tuple[bool, ...] = (False,), doc_mask: int = 0) -> list[dict]:
    """One row per (length, pe), with MFU and the TAPA / RoPE tokens/s ratio filled in.
    `on_row(rows)` is called after each config with the rows so far (ratios filled where the RoPE
    row of that length has run), so that a run cut by a time limit keeps what it measured."""
    from tapa._optional import require

    configs = [(n, pe, ckpt) for n in lengths for pe in pes for ckpt in checkpointing]
    rows = []
    bar = require("tqdm").tqdm(configs, desc="bench model", disable=not progress)
    for seq_len, pe, ckpt in bar:
        bar.set_postfix(pe=pe, seq_len=seq_len)
        if tokens_per_step < seq_len:
            raise ValueError(f"tokens_per_step ({tokens_per_step}) must be >= seq_len ({seq_len})")
        cfg = ModelConfig(**parse_variant(pe), **model_kwargs)
        try:
            row = measure(cfg, seq_len=seq_len, batch=tokens_per_step // seq_len, warmup=warmup,
                          steps=steps, device=device, compile_model=compile_model,
                          checkpointing=ckpt, doc_mask=doc_mask)
        except torch.cuda.OutOfMemoryError:
            row = {"pe": cfg.label, "seq_len": seq_len, "checkpointing": ckpt, "attention": "OOM"}
        if row["attention"] == "OOM":  # outside the except: its traceback no longer pins memory
            gc.collect()
            torch.cuda.empty_cache()
        row["mfu"] = (round(row["tflops"] / peak_tflops, 4)
                      if peak_tflops and row.get("tflops") is not None else None)
        rows.append(row)
        _fill_ratios(rows)
        if on_row is not None:
            on_row(rows)
    return rows


def _fill_ratios(rows: list[dict]) -> None:
    """tapa_over_rope of each row: its tokens/s over the RoPE row's of the same length, if run."""
    for row in rows:
        rope = next((r for r in rows if r["seq_len"] == row["seq_len"] and r["pe"] == "RoPE"
                     and r.get("checkpointing") == row.get("checkpointing")
                     and r.get("tokens_per_s")), None)
        if rope and row.get("tokens_per_s"):
            row["tapa_over_rope"] = round(row["tokens_per_s"] / rope["tokens_per_s"], 3)


def gpu_slug(device_name: str) -> str:
    """"NVIDIA H200" -> "h200"."""
    name = device_name.lower().removeprefix("nvidia").strip()
    return re.sub(r"[^a-z0-9]+", "-", name).strip("-") or "gpu"


def peak_for(device_name: str) -> float | None:
    return next((tf for key, tf in PEAK_BF16_TFLOPS.items() if key in device_name), None)


def write_results(rows: list[dict], out_dir: Path, *, command: str, device_name: str,
                  peak_tflops: float | None, notes: list[str]) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / "results.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, FIELDS)
        writer.writeheader()
        writer.writerows({k: row.get(k) for k in FIELDS} for row in rows)
    header = "| " + " | ".join(FIELDS) + " |"
    lines = [
        "# Model training throughput: TAPA vs RoPE", "",
        f"- Command: `{command}`",
        f"- Date (UTC): {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M}",
        f"- Device: {device_name}; torch {torch.__version__}; Python {platform.python_version()}",
        f"- Peak bf16 for MFU: {peak_tflops} TFLOP/s" if peak_tflops else "- MFU: no peak known",
        "- FLOPs/token = 6 * N_matmul + 6 * n_layers * seq_len * dim (causal attention; a local"
        " layer's window for seq_len; with --doc-mask the documents' sum of n^2 / tokens, the"
        " attention the mask keeps);"
        " tapa_over_rope = tokens/s / RoPE tokens/s at the same length (target >= 0.9; the hybrid"
        " should exceed 1 at 32k).",
        *[f"- {note}" for note in notes], "",
        header, "|" + "---|" * len(FIELDS),
        *["| " + " | ".join("" if row.get(k) is None else str(row.get(k)) for k in FIELDS) + " |"
          for row in rows], "",
    ]
    if plot_throughput(rows, out_dir / "throughput.png", device_name):
        lines.append("![tokens/s](throughput.png)\n")
    (out_dir / "README.md").write_text("\n".join(lines))


def plot_throughput(rows: list[dict], path: Path, device_name: str) -> bool:
    """Grouped bars: training tokens/s per context length, one bar per positional encoding."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    lengths = sorted({r["seq_len"] for r in rows})
    pes = list(dict.fromkeys(r["pe"] for r in rows))
    width = 0.8 / len(pes)
    fig, ax = plt.subplots(figsize=(6, 3.8))
    for i, pe in enumerate(pes):
        values = [next((r.get("tokens_per_s") or 0 for r in rows
                        if r["pe"] == pe and r["seq_len"] == n), 0) for n in lengths]
        ax.bar([x + i * width for x in range(len(lengths))], values, width, label=pe)
    ax.set_xticks([x + width * (len(pes) - 1) / 2 for x in range(len(lengths))])
    ax.set_xticklabels([f"{n:,}" for n in lengths])
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("training tokens/s")
    first = next((r for r in rows if r.get("params_m")), {})
    ax.set_title(f"{first.get('model', '')} ({first.get('params_m')}M params), train step, "
                 f"{device_name}", fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def command_line(args: argparse.Namespace) -> str:
    """The full command that reproduces this run, every option spelled out."""
    parts = ["tapa bench model", "--lengths", *map(str, args.lengths),
             "--tokens-per-step", str(args.tokens_per_step), "--warmup", str(args.warmup),
             "--steps", str(args.steps), "--pes", *args.pes]
    if args.peak_tflops:
        parts += ["--peak-tflops", str(args.peak_tflops)]
    if args.checkpointing != (False,):
        parts += ["--checkpointing", ",".join(map(checkpointing_name, args.checkpointing))]
    if args.doc_mask:
        parts += ["--doc-mask", str(args.doc_mask)]
    parts += ["--compile"] * args.compile + ["--cpu-smoke"] * args.cpu_smoke
    return " ".join(shlex.quote(p) if p != "tapa bench model" else p for p in parts + ["--out", args.out])


def run(args: argparse.Namespace) -> int:
    if args.cpu_smoke:
        device, model_kwargs = torch.device("cpu"), SMOKE_MODEL
        lengths = [n for n in args.lengths if n <= 256] or [64, 128]
        tokens_per_step, device_name = max(lengths) * 2, f"CPU ({platform.machine()})"
    else:
        if not torch.cuda.is_available():
            raise SystemExit("tapa bench model needs a CUDA GPU (use --cpu-smoke to check the code "
                             "path on CPU)")
        device, model_kwargs = torch.device("cuda"), BENCH_MODEL
        lengths, tokens_per_step = args.lengths, args.tokens_per_step
        device_name = torch.cuda.get_device_name(device)
    peak = args.peak_tflops or (None if args.cpu_smoke else peak_for(device_name))
    if args.out is None:
        args.out = ("runs/bench/model-cpu-smoke" if args.cpu_smoke
                    else f"runs/bench/model-throughput-{gpu_slug(device_name)}")
    checkpointing = args.checkpointing
    blocks = model_kwargs["n_layers"]
    if any(value is not True and value > blocks for value in checkpointing):
        raise SystemExit(f"tapa bench model: --checkpointing {','.join(map(checkpointing_name, checkpointing))}: "
                         f"the model has {blocks} blocks")
    total = len(lengths) * len(args.pes) * len(checkpointing)

    def notes_for(rows: list[dict]) -> list[str]:
        notes = [] if len(rows) == total else [f"PARTIAL: {len(rows)} of {total} configs so far"]
        if any(r.get("attention") == "tapa-reference" for r in rows) and not args.cpu_smoke:
            notes.append("WARNING: the fused TAPA kernel was not used (tapa.ops.tapa.fused "
                         "missing or unsupported); TAPA rows time the PyTorch reference.")
        return notes

    def write(rows: list[dict]) -> None:
        write_results(rows, Path(args.out), command=command_line(args), device_name=device_name,
                      peak_tflops=peak, notes=notes_for(rows))
        row = rows[-1]
        print(f"[{len(rows)}/{total}] {row['pe']} L={row['seq_len']}: {row.get('tokens_per_s')} tok/s",
              flush=True)

    rows = run_benchmark(model_kwargs=model_kwargs, lengths=lengths, pes=args.pes,
                         tokens_per_step=tokens_per_step, warmup=args.warmup, steps=args.steps,
                         device=device, peak_tflops=peak, compile_model=args.compile, on_row=write,
                         checkpointing=checkpointing, doc_mask=args.doc_mask)
    notes = notes_for(rows)
    for row in rows:
        print(f"{row['pe']:>24} L={row['seq_len']:>6} ckpt={checkpointing_name(row.get('checkpointing', False))}  "
              f"{row.get('attention'):>14}  "
              f"{row.get('tokens_per_s')} tok/s  MFU {row.get('mfu')}  "
              f"TAPA/RoPE {row.get('tapa_over_rope')}")
    for note in notes:
        print(note)
    print(f"wrote {args.out}/results.csv and README.md")
    return 0
