"""`tapa train --doc-mask`: trains inside documents, and the run records the flag; under context
parallelism (`--cp 2`, torchrun) it trains as one process does, in torch's strict deterministic
mode (`--deterministic`) too."""

import json
import random

from trainkit import losses, records, one_thread, torchrun_train  # noqa: F401 (autouse fixture)

from tapa.cli import main


def _short_documents(path, count=400, seed=0):
    """A jsonl corpus of short documents (10-60 words), so that every 128-token row crosses several."""
    rng = random.Random(seed)
    words = "alpha beta gamma delta kappa lambda sigma omega river stone cloud light".split()
    with path.open("w") as f:
        for _ in range(count):
            text = " ".join(rng.choice(words) for _ in range(rng.randint(10, 60)))
            f.write(json.dumps({"text": text}) + "\n")
    return path


def _args(data, cache_dir, run_dir, *extra):
    return ["--recipe", "tiny", "--data", str(data), "--cache-dir", str(cache_dir),
            "--vocab-size", "300", "--dim", "32", "--n-layers", "4",
            "--n-heads", "2", "--layer-pattern", "LLLG", "--local-window", "8",
            "--batch-size", "4", "--seq-len", "128", "--steps", "2", "--log-every", "1",
            "--eval-every", "0", "--eval-batches", "1", "--no-progress", "--no-plot",
            "--device", "cpu", "--run-dir", str(run_dir), *extra]


def _train(data, cache_dir, run_dir, *extra):
    return main(["train", *_args(data, cache_dir, run_dir, *extra)])


def test_doc_mask_changes_what_the_model_sees_and_is_recorded(tmp_path):
    data = _short_documents(tmp_path / "docs.jsonl")
    assert _train(data, tmp_path / "cache", tmp_path / "plain") == 0
    assert _train(data, tmp_path / "cache", tmp_path / "masked", "--doc-mask") == 0
    plain, masked = records(tmp_path / "plain"), records(tmp_path / "masked")
    # same weights and data at step 1: only the mask differs
    assert plain[0]["loss"] != masked[0]["loss"]
    assert json.loads((tmp_path / "masked" / "config.json").read_text())["train"]["doc_mask"] is True
    assert json.loads((tmp_path / "plain" / "config.json").read_text())["train"]["doc_mask"] is False


def test_doc_mask_under_context_parallelism_trains_as_one_process(tmp_path):
    """Rows of 128 tokens over documents of 10-60 words, cut into 4 chunks of 32 over 2 processes:
    documents cross the chunks, and the losses are the one-process run's (float32 sums in another
    order: 1e-5). Both runs in strict deterministic mode: no op on their path lacks a deterministic
    version on CPU (one that did would stop the run)."""
    data = _short_documents(tmp_path / "docs.jsonl")
    assert _train(data, tmp_path / "cache", tmp_path / "one", "--doc-mask", "--deterministic") == 0
    torchrun_train(2, _args(data, tmp_path / "cache", tmp_path / "cp2", "--doc-mask", "--cp", "2",
                            "--deterministic"))
    one, cp2 = losses(tmp_path / "one"), losses(tmp_path / "cp2")
    assert len(one) == len(cp2) == 2 and all(abs(a - b) <= 1e-5 for a, b in zip(one, cp2)), (one, cp2)
    config = json.loads((tmp_path / "cp2" / "config.json").read_text())
    assert config["context_parallel"] == 2 and config["train"]["deterministic"] is True
