"""lm-evaluation-harness on a saved TAPA model, offline, with the tasks in examples/lm_eval_task.

Always: the path lm-eval's `hf` model takes (AutoModelForCausalLM / AutoTokenizer with
trust_remote_code, right-padded batches without an attention mask, log-softmax of the
continuation tokens) reproduces the scores of the TapaLM itself, one unpadded sequence at a time.
With lm_eval installed: `lm_eval --model hf ...` runs both tasks and its accuracy and byte
perplexity equal those scores.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast  # noqa: E402

from tapa.data.tokenizer import EOT_TOKEN, train_bpe  # noqa: E402
from tapa.hf import TapaConfig, TapaForCausalLM  # noqa: E402

from helpers import ROOT, load_file  # noqa: E402

TASKS = ROOT / "examples" / "lm_eval_task"
task_utils = load_file(TASKS / "utils.py", "lm_eval_task_utils")


def _rows(name):
    """The rows as the tasks see them (multiple-choice answers shuffled by the task's loader)."""
    return task_utils.choice_rows() if name == "python_choices.jsonl" else task_utils.read_rows(name)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny random TAPA model with a BPE tokenizer trained on the task texts."""
    texts = [r["context"] + "".join(r["choices"]) for r in _rows("python_choices.jsonl")]
    texts += [r["text"] for r in _rows("python_snippets.jsonl")]
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=train_bpe(texts * 4, 320, progress=False),
                                        eos_token=EOT_TOKEN, pad_token=EOT_TOKEN)
    torch.manual_seed(0)
    config = TapaConfig(vocab_size=len(tokenizer), dim=64, n_layers=2, n_heads=4, n_kv_heads=2,
                        init_std=0.1, eos_token_id=tokenizer.eos_token_id)
    path = tmp_path_factory.mktemp("tapa-lm-eval")
    TapaForCausalLM(config).eval().save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@torch.no_grad()
def score(model_dir: Path):
    """Accuracy and byte perplexity of both tasks as lm-eval computes them, on two paths: the
    transformers model in right-padded batches, and the bare TapaLM one sequence at a time."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=True)
    model = AutoModelForCausalLM.from_pretrained(model_dir, trust_remote_code=True).eval()
    encode = lambda text: tokenizer(text, add_special_tokens=False).input_ids  # noqa: E731

    requests = []  # (context ids, continuation ids)
    docs = _rows("python_choices.jsonl")
    for doc in docs:
        for choice in doc["choices"]:
            context = encode(doc["context"])
            requests.append((context, encode(doc["context"] + choice)[len(context):]))
    snippets = [doc["text"] for doc in _rows("python_snippets.jsonl")]
    prefix = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    requests += [([prefix], encode(text)) for text in snippets]

    batched, alone = [], []
    for start in range(0, len(requests), 4):  # right padding, no attention mask, like lm-eval
        batch = requests[start:start + 4]
        inputs = [(ctx + cont)[:-1] for ctx, cont in batch]
        width = max(map(len, inputs))
        ids = torch.tensor([seq + [0] * (width - len(seq)) for seq in inputs])
        logprobs = model(ids).logits.log_softmax(-1)
        for row, (ctx, cont) in enumerate(batch):
            positions = torch.arange(len(ctx) - 1, len(ctx) - 1 + len(cont))
            batched.append(float(logprobs[row, positions, cont].sum()))
            single = model.model(torch.tensor([inputs[row]])).log_softmax(-1)[0]
            alone.append(float(single[positions, cont].sum()))

    def metrics(lls):
        choice_lls = lls[:3 * len(docs)]
        correct = [max(range(3), key=lambda c: choice_lls[3 * i + c]) == doc["answer"]
                   for i, doc in enumerate(docs)]
        # acc_norm: log-likelihood per character of the choice, as lm-eval normalises
        correct_norm = [max(range(3), key=lambda c: choice_lls[3 * i + c] / len(doc["choices"][c]))
                        == doc["answer"] for i, doc in enumerate(docs)]
        rolling = lls[3 * len(docs):]
        n_bytes = sum(len(text.encode()) for text in snippets)
        return {"acc": sum(correct) / len(docs), "acc_norm": sum(correct_norm) / len(docs),
                "byte_perplexity": math.exp(-sum(rolling) / n_bytes)}

    return metrics(batched), metrics(alone), batched, alone


def test_loglikelihood_path_matches_tapa_lm(model_dir):
    batched_metrics, alone_metrics, batched, alone = score(model_dir)
    assert batched == pytest.approx(alone, rel=1e-5, abs=1e-4)
    assert batched_metrics == pytest.approx(alone_metrics, rel=1e-6)
    assert 1 < batched_metrics["byte_perplexity"] < 1e4


@pytest.mark.skipif(importlib.util.find_spec("lm_eval") is None,
                    reason="lm-evaluation-harness not installed (pip install 'lm-eval[hf]')")
def test_lm_eval_cli_offline(model_dir, tmp_path):
    expected, _, _, _ = score(model_dir)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    command = [sys.executable, "-m", "lm_eval", "--model", "hf",
               "--model_args", f"pretrained={model_dir},trust_remote_code=True,dtype=float32",
               "--tasks", "tapa_python_choices,tapa_python_perplexity", "--include_path", str(TASKS),
               "--device", "cpu", "--batch_size", "4", "--output_path", str(tmp_path / "out")]
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    [results_file] = list((tmp_path / "out").rglob("results_*.json"))
    results = json.loads(results_file.read_text())["results"]
    assert results["tapa_python_choices"]["acc,none"] == pytest.approx(expected["acc"])
    assert results["tapa_python_choices"]["acc_norm,none"] == pytest.approx(expected["acc_norm"])
    assert results["tapa_python_perplexity"]["byte_perplexity,none"] == pytest.approx(
        expected["byte_perplexity"], rel=1e-4)
