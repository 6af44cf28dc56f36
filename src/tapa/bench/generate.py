"""`tapa bench generate`: greedy decoding of whole models, milliseconds per generated token.

Per model (TAPA, the TAPA hybrid, RoPE by default; the ~124M shape of `tapa bench model`, bf16
weights), batch and prompt length: the prompt is prefilled, then `--new-tokens` tokens are
generated greedily three ways, and the time per decoding step is reported (the first step, in
which the graph mode captures, is left out):
- eager: `TapaLM.forward` with a KVCache, one call per token (each step slices the cache);
- static: the static-shape step (`tapa.model.StaticDecoder`, what `TapaLM.generate` runs);
- graph: the same step captured once as a CUDA graph and replayed (`TapaLM.generate` on CUDA).
Every row is also set against the first model's (`--pes`, RoPE by default) in the same batch,
prompt and mode: the model-level answer to "what does TAPA's decode cost against RoPE's".
Each mode's tokens are compared with the eager loop's (`agree_steps`: how many leading tokens are
equal). In bf16 the modes sum in different orders (the static step reads every cache slot, masked),
so a near tie may flip late in a run; a wrong step differs from the first tokens on. Writes
generate.csv and generate.md.

    tapa bench generate                          # H200: prompts of 4k and 32k, batch 1 and 8
    tapa bench generate --smoke --out /tmp/gen   # the same logic, tiny, on CPU (graph mode skipped)
"""

from __future__ import annotations

import argparse
import datetime
import platform
import shlex
import sys
import time
from pathlib import Path

import torch

from tapa._paths import write_csv
from tapa.bench.model import BENCH_MODEL, parse_variant
from tapa.model import ModelConfig, StaticDecoder, TapaLM

SMOKE_MODEL = dict(dim=32, n_layers=4, n_heads=2, vocab_size=97)
MODES = ("eager", "static", "graph")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prompt-lens", type=int, nargs="+", default=[4096, 32768])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--new-tokens", type=int, default=64, help="tokens generated per run (default 64)")
    parser.add_argument("--pes", nargs="+", default=["rope", "tapa", "tapa:LLLG:256"],
                        help="models: a positional encoding, or PE:LAYER_PATTERN:LOCAL_WINDOW; the "
                             "first is the anchor of the 'x first' column (default: RoPE, timed "
                             "first so that a cut run keeps it)")
    parser.add_argument("--out", type=Path, default=Path("runs/bench/generate"))
    parser.add_argument("--smoke", action="store_true", help="tiny model on CPU: tests the logic, not speed")


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


@torch.no_grad()
def time_modes(model: TapaLM, prompt: torch.Tensor, new_tokens: int, modes=MODES) -> dict:
    """{mode: (ms per decoding step, tokens (B, new_tokens))}: the prompt prefilled, one untimed
    step (the graph mode captures in it), then new_tokens - 2 timed steps. Graph mode only on CUDA."""
    device = prompt.device
    results = {}
    for mode in modes:
        if mode == "graph" and device.type != "cuda":
            continue
        cache = model.new_kv_cache(prompt.shape[0], prompt.shape[1] + new_tokens)
        token = model(prompt, 0, cache)[:, -1:].argmax(-1)
        if mode == "eager":
            def step(token):
                return model(token, cache.length, cache)[:, -1:].argmax(-1)
        else:
            decoder = StaticDecoder(model, cache, cuda_graph=mode == "graph")

            def step(token):
                return decoder(token)[:, -1:].argmax(-1)
        tokens = [token, step(token)]
        _sync(device)
        start = time.perf_counter()
        for _ in range(new_tokens - 2):
            tokens.append(step(tokens[-1]))
        _sync(device)
        ms = (time.perf_counter() - start) * 1e3 / (new_tokens - 2)
        results[mode] = (ms, torch.cat(tokens, dim=1))
    return results


def agree_steps(tokens: torch.Tensor, reference: torch.Tensor) -> int:
    """How many leading generated positions (columns) equal the reference's in every sequence."""
    same = (tokens == reference).all(dim=0)
    return int(same.long().cumprod(0).sum())


def run(args) -> int:
    if args.new_tokens < 3:
        raise SystemExit("tapa bench generate: --new-tokens must be at least 3")
    if not torch.cuda.is_available() and not args.smoke:
        raise SystemExit("tapa bench generate needs a CUDA GPU (or --smoke to test the script on CPU)")
    device = torch.device("cuda" if not args.smoke else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    shape = SMOKE_MODEL if args.smoke else BENCH_MODEL
    prompt_lens, batches = ([12, 20], [1, 2]) if args.smoke else (args.prompt_lens, args.batch)
    rows = []
    argv = sys.argv[3:] if sys.argv[1:3] == ["bench", "generate"] else sys.argv[1:]
    command = "tapa bench generate " + " ".join(shlex.quote(a) for a in argv)
    for spec in args.pes:
        try:
            cfg = ModelConfig(**parse_variant(spec), **shape)
        except ValueError as err:
            raise SystemExit(f"tapa bench generate: {err}") from err
        torch.manual_seed(0)
        model = TapaLM(cfg).to(device=device, dtype=dtype).eval()
        for batch in batches:
            for length in prompt_lens:
                prompt = torch.randint(0, cfg.vocab_size, (batch, length), device=device)
                results = time_modes(model, prompt, args.new_tokens)
                eager_ms, eager_tokens = results["eager"]
                for mode, (ms, tokens) in results.items():
                    rows.append({"model": spec, "batch": batch, "prompt": length, "mode": mode,
                                 "ms_per_token": ms, "x_eager": ms / eager_ms,
                                 "agree_steps": agree_steps(tokens, eager_tokens), "new_tokens": args.new_tokens})
                print(f"{spec} batch {batch} prompt {length}: " + ", ".join(
                    f"{mode} {ms:.3f} ms/token" for mode, (ms, _) in results.items()), flush=True)
                write_results(args.out, rows, command=command, device=device, smoke=args.smoke)
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    print(f"wrote {args.out}/generate.csv, generate.md")
    return 0


def write_results(out: Path, rows: list[dict], *, command: str, device, smoke: bool) -> None:
    out.mkdir(parents=True, exist_ok=True)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = ["# Greedy decoding of whole models: ms per generated token", "", f"- command: `{command}`",
             f"- date: {date}", f"- device: {name}",
             f"- torch {torch.__version__}, python {platform.python_version()}",
             "- eager: forward with a KVCache per token; static: TapaLM.generate without a graph; "
             "graph: TapaLM.generate with the step captured once and replayed",
             "- tokens as eager: the leading generated tokens equal to the eager loop's, of all (bf16 "
             "sums in another order may flip a late near tie; a wrong step differs from the start)",
             "- x first model: against this project's own model of that kind (a RoPE model here is SDPA "
             "attention with the rotation as float32 elementwise ops), not a tuned serving stack; "
             "`tapa bench decode` sets the TAPA step against SDPA's fastest backend"]
    if smoke:
        lines.append("- SMOKE RUN on CPU: the times say nothing about speed")
    anchor = rows[0]["model"] if rows else ""
    first = {(r["batch"], r["prompt"], r["mode"]): r["ms_per_token"] for r in rows if r["model"] == anchor}
    for r in rows:
        r["x_first"] = r["ms_per_token"] / first[(r["batch"], r["prompt"], r["mode"])] \
            if (r["batch"], r["prompt"], r["mode"]) in first else float("nan")
    write_csv(out / "generate.csv", rows)
    lines += ["", f"| model | batch | prompt | mode | ms / token | x eager | x {anchor} | tokens as eager |",
              "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['model']} | {r['batch']} | {r['prompt']} | {r['mode']} | {r['ms_per_token']:.3f} | "
              f"{r['x_eager']:.2f} | {r['x_first']:.2f} | {r['agree_steps']} of {r['new_tokens']} |"
              for r in rows]
    best = "graph" if any(r["mode"] == "graph" for r in rows) else "static"
    others = [r for r in rows if r["model"] != anchor and r["mode"] == best and r["x_first"] == r["x_first"]]
    if others:
        lines += ["", f"**{best} mode, ms per token over {anchor}'s** (batch / prompt: ratio): " + "; ".join(
            f"{model} " + ", ".join(f"{r['batch']} / {r['prompt']}: {r['x_first']:.2f}"
                                    for r in others if r["model"] == model)
            for model in dict.fromkeys(r["model"] for r in others))]
    (out / "generate.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m tapa.bench.generate")
    add_arguments(parser)
    sys.exit(run(parser.parse_args()))
