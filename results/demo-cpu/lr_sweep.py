"""How the demo's cpu learning rates were chosen: train one model of the `tapa demo` cpu profile at
one learning rate, evaluate it like the demo, print one JSON line.

    env OMP_NUM_THREADS=1 python results/demo-cpu/lr_sweep.py hybrid 2e-3 /tmp/sweep/hybrid-2e-3 \\
        '{"steps": 300, "warmup_steps": 15}'

The first argument is a DemoModel name (rope, tapa, hybrid); the last overrides DemoProfile fields.
The lines of the runs behind README.md are in lr_sweep.jsonl.
"""

import dataclasses
import json
import sys
import time
from pathlib import Path

import torch

from tapa.data import build_corpus
from tapa.eval.demo import DEMO_MODELS, PROFILES, demo_configs
from tapa.eval.evaluate import EvalOptions, evaluate_run
from tapa.train import train

name, lr, out = sys.argv[1], float(sys.argv[2]), Path(sys.argv[3])
overrides = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}
model = next(m for m in DEMO_MODELS if m.name == name)
profile = dataclasses.replace(PROFILES["cpu"], lr={name: lr}, **overrides)
device = torch.device("cpu")
started = time.perf_counter()
train_cfg, model_cfg, data_cfg = demo_configs(profile, model, out, device, False, None)
corpus = build_corpus(data_cfg, progress=False)
train(train_cfg, dataclasses.replace(model_cfg, vocab_size=corpus.vocab_size), data_cfg)
train_seconds = time.perf_counter() - started
started = time.perf_counter()
options = EvalOptions(multiples=profile.multiples, stride=profile.stride, max_tokens=profile.max_tokens,
                      progress=False)
results = evaluate_run(out, options, device=device)
val_losses = [r["val_loss"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
              if r.get("val_loss") is not None]
print(json.dumps({
    "model": name, "lr": lr, "over": overrides, "threads": torch.get_num_threads(),
    "train_s": round(train_seconds, 1), "eval_s": round(time.perf_counter() - started, 1),
    "final_val_loss": round(val_losses[-1], 4) if val_losses else None,
    "ppl": {m["label"]: [round(r["perplexity"], 2) for r in m["perplexity"]] for m in results["methods"]}}))
