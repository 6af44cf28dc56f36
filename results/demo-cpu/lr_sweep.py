"""How the demo's learning rates were chosen: train one method of the `tapa demo` cpu profile at
one learning rate, evaluate it like the demo, print one JSON line.

    taskset -c 0,1 env OMP_NUM_THREADS=2 python results/demo-cpu/lr_sweep.py tapa 1e-3 /tmp/sweep/tapa-1e-3 \
        '{"steps": 1000, "warmup_steps": 50}'

The last argument overrides DemoProfile fields (the 250-step sweep passed
'{"steps": 250, "warmup_steps": 25}'). Results of the runs behind README.md are in lr_sweep.jsonl.
"""

import dataclasses
import json
import sys
import time
from pathlib import Path

import torch

from tapa.data import build_corpus
from tapa.eval.demo import PROFILES, _configs
from tapa.eval.evaluate import EvalOptions, evaluate_run
from tapa.train import train

pe, lr, out = sys.argv[1], float(sys.argv[2]), Path(sys.argv[3])
overrides = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}
profile = dataclasses.replace(PROFILES["cpu"], lr={pe: lr}, **overrides)
device = torch.device("cpu")
started = time.perf_counter()
train_cfg, model_cfg, data_cfg = _configs(profile, pe, out, device, False, None)
corpus = build_corpus(data_cfg, progress=False)
train(train_cfg, dataclasses.replace(model_cfg, vocab_size=corpus.vocab_size), data_cfg)
train_seconds = time.perf_counter() - started
started = time.perf_counter()
options = EvalOptions(multiples=profile.multiples, stride=profile.stride, max_tokens=profile.max_tokens,
                      eval_pe=profile.eval_pe if pe == "rope" else (), progress=False)
results = evaluate_run(out, options, device=device)
print(json.dumps({
    "pe": pe, "lr": lr, "over": sys.argv[4] if len(sys.argv) > 4 else "",
    "train_s": round(train_seconds, 1), "eval_s": round(time.perf_counter() - started, 1),
    "ppl": {m["label"]: [round(r["perplexity"], 2) for r in m["perplexity"]] for m in results["methods"]}}))
