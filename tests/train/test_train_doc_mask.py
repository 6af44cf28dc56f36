"""`tapa train --doc-mask`: trains inside documents, and the run records the flag."""

import json
import random

from trainkit import records, one_thread  # noqa: F401 (autouse fixture)

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


def _train(data, cache_dir, run_dir, *extra):
    return main(["train", "--recipe", "tiny", "--data", str(data), "--cache-dir", str(cache_dir),
                 "--vocab-size", "300", "--dim", "32", "--n-layers", "4",
                 "--n-heads", "2", "--layer-pattern", "LLLG", "--local-window", "8",
                 "--batch-size", "4", "--seq-len", "128", "--steps", "2", "--log-every", "1",
                 "--eval-every", "0", "--eval-batches", "1", "--no-progress", "--no-plot",
                 "--device", "cpu", "--run-dir", str(run_dir), *extra])


def test_doc_mask_changes_what_the_model_sees_and_is_recorded(tmp_path):
    data = _short_documents(tmp_path / "docs.jsonl")
    assert _train(data, tmp_path / "cache", tmp_path / "plain") == 0
    assert _train(data, tmp_path / "cache", tmp_path / "masked", "--doc-mask") == 0
    plain, masked = records(tmp_path / "plain"), records(tmp_path / "masked")
    # same weights and data at step 1: only the mask differs
    assert plain[0]["loss"] != masked[0]["loss"]
    assert json.loads((tmp_path / "masked" / "config.json").read_text())["train"]["doc_mask"] is True
    assert json.loads((tmp_path / "plain" / "config.json").read_text())["train"]["doc_mask"] is False
