"""`tapa eval --data SOURCE` and `--tasks`, end to end on a tiny run: another text gives other numbers
and says where they came from, in a folder of its own; the task grids, tables and heat maps are
written; bad input is a one-line error."""

import json

import pytest

from helpers import python_like_text

from tapa.cli import main

FAST = ["--lengths", "16,32", "--stride", "16", "--max-tokens", "64", "--no-progress", "--device", "cpu"]
PROSE = "".join(f"The river {i} flows past the old mill number {i * 7 % 101}. Boats drift by slowly.\n"
                for i in range(400))


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A 3-step RoPE run on Python-like text with a 300-token BPE, and a prose file beside it."""
    from tapa.data import DataConfig
    from tapa.model import ModelConfig
    from tapa.train import TrainConfig, train

    root = tmp_path_factory.mktemp("eval_data")
    (root / "corpus.txt").write_text(python_like_text(2000))
    (root / "prose.txt").write_text(PROSE)
    data_cfg = DataConfig(source=str(root / "corpus.txt"), cache_dir=str(root / "cache"), vocab_size=300,
                          val_fraction=0.1, test_fraction=0.1)
    return train(TrainConfig(name="rope", run_dir=str(root / "rope"), seq_len=32, batch_size=2, steps=3,
                             warmup_steps=1, eval_every=0, save_every=0, eval_batches=1, log_every=1,
                             progress=False, plot=False),
                 ModelConfig(vocab_size=300, dim=32, n_layers=1, n_heads=2, pe="rope"), data_cfg)


def test_data_gives_other_numbers_says_its_source_and_keeps_the_default_eval(run_dir, capsys):
    assert main(["eval", str(run_dir), *FAST]) == 0
    default = json.loads((run_dir / "eval" / "results.json").read_text())
    before = (run_dir / "eval" / "results.json").read_bytes()
    prose = run_dir.parent / "prose.txt"
    assert main(["eval", str(run_dir), "--data", str(prose), *FAST]) == 0
    printed = capsys.readouterr().out
    out = run_dir / "eval-prose.txt"
    results = json.loads((out / "results.json").read_text())
    assert (run_dir / "eval" / "results.json").read_bytes() == before  # the default eval is untouched
    data = results["data"]
    assert data["source"] == str(prose) and data["split"] == "all" and data["run_corpus"] is False
    assert data["tokens"] > 1000 and data["tokens"] != default["data"]["tokens"]
    assert default["data"]["run_corpus"] is True and default["data"]["split"] == "test"
    # the run's own tokenizer: the same sha256 as the one the run recorded
    recorded = json.loads((run_dir / "config.json").read_text())["corpus"]["tokenizer"]["sha256"]
    assert data["tokenizer"]["sha256"] == recorded
    losses = [r["loss"] for r in results["methods"][0]["perplexity"]]
    assert losses != [r["loss"] for r in default["methods"][0]["perplexity"]]
    markdown = (out / "results.md").read_text()
    assert f"Data: `{prose}` (all of it, {data['tokens']:,} tokens with the run's own tokenizer)" in markdown
    assert "Data: the test split of the run's corpus" in (run_dir / "eval" / "results.md").read_text()
    assert f"data: {prose} (all," in printed and str(out) in printed


def test_tasks_write_grids_tables_and_heat_maps(run_dir, capsys):
    out = run_dir.parent / "tasks-out"
    settings = ["--distractors", "1", "--values", "2", "--hops", "2", "--chains", "2"]
    assert main(["eval", str(run_dir), "--data", str(run_dir.parent / "prose.txt"), "--out", str(out),
                 "--tasks", "all", "--task-lengths", "400", "--task-depths", "0,1", "--task-trials", "1",
                 *settings, "--passkey", "--passkey-lengths", "300", "--passkey-trials", "1",
                 "--retrieval-batch-tokens", "800", *FAST]) == 0
    printed = capsys.readouterr().out
    results = json.loads((out / "results.json").read_text())
    [method] = results["methods"]
    assert list(method["tasks"]) == ["single-key", "multi-key", "multi-value", "variable-tracking"]
    for task, grid in method["tasks"].items():
        assert grid["lengths"] == [400] and grid["depths"] == [0.0, 1.0] and grid["trials"] == 1
        assert grid["batch_tokens"] == 800  # both depths' prompts in one batch
        assert len(grid["accuracy"]) == 1 and len(grid["accuracy"][0]) == 2
        assert len(grid["recall"][0]) == 2 and all(0 <= r <= 1 for r in grid["recall"][0])  # item recall
        assert grid["filler"] == "prose.txt"  # drawn from the --data text
        png = out / f"retrieval_{task}.png"
        assert png.is_file() and png.stat().st_size > 0
        assert f"### {task}" in printed
    assert method["tasks"]["multi-key"]["settings"] == {"distractors": 1}
    assert method["passkey"]["filler"] == "prose.txt"  # --data makes the passkey filler that text too
    assert method["passkey"]["batch_tokens"] == 800
    markdown = (out / "results.md").read_text()
    assert "## Retrieval tasks" in markdown and "Wilson" in markdown
    assert "| all depths |" in markdown and "(0-" in markdown  # accuracy with its interval
    # item recall rows under the two tasks whose answer lists several items, not under the others
    assert markdown.count("| item recall, all depths |") == 2 and "item recall\" is the mean share" in markdown


def test_default_trials_follow_the_depths(run_dir):
    from tapa.eval.command import options_from_args
    from tapa.eval.evaluate import EvalOptions

    assert EvalOptions(tasks=("single-key",)).task_trials == 77  # 5 depths: ceil(385 / 5)
    assert EvalOptions(tasks=("single-key",), task_depths=(0.0, 1.0)).task_trials == 193
    import argparse

    from tapa.eval.command import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    options = options_from_args(parser.parse_args([str(run_dir), "--tasks", "multi-key", "--distractors", "5"]))
    assert options.tasks == ("multi-key",) and options.task_settings.distractors == 5
    assert options.split == "test" and options.data is None
    assert options.retrieval_batch_tokens == EvalOptions().retrieval_batch_tokens == 262144
    options = options_from_args(parser.parse_args([str(run_dir), "--passkey", "--retrieval-batch-tokens", "4096"]))
    assert options.retrieval_batch_tokens == 4096


@pytest.mark.parametrize("args, message", [
    (["--data", "{root}/missing.txt"], r"--data .*missing.txt: source path .* does not exist"),
    (["--data", "{root}/empty.txt"], r"--data .*empty.txt: source file .* is empty"),
    (["--data", "{root}/short.txt", "--lengths", "64"],
     r"--data .*short.txt \(all of it\) has \d+ tokens with the run's tokenizer; perplexity at length 64 "
     r"needs at least 65"),
    (["--split", "all"], "--split all reads the whole of a --data source"),
    (["--text-field", "body"], "--text-field names the text field of a --data source"),
    (["--task-trials", "3"], "the retrieval tasks read --task-trials, but they run only with --tasks"),
    (["--values", "3"], "the retrieval tasks read --values, but they run only with --tasks"),
    (["--tasks", "multi-value", "--values", "1"], "--values: values must be an int >= 2"),
    (["--tasks", "single-key", "--task-lengths", "20"], "--task-lengths 20 too short for single-key"),
    (["--tasks", "multi-value"], r"the default task lengths \(1x, 2x, 4x and 8x the training length 32\) include "
                                 r"32,64,128,256, too short for multi-value"),
    (["--seed", "3"], "--seed sets the passkey and task prompts"),
])
def test_bad_input_is_a_one_line_error(run_dir, args, message):
    root = run_dir.parent
    (root / "empty.txt").write_text("")
    (root / "short.txt").write_text("x = 1\ny = 2\n")
    args = [a.format(root=root) for a in args]
    flags = [f for f in FAST if f not in ("--lengths", "16,32")] if "--lengths" in args else FAST
    with pytest.raises(SystemExit, match=f"^tapa eval: error: {message}") as caught:
        main(["eval", str(run_dir), "--out", str(root / "bad-out"), *args, *flags])
    assert "\n" not in str(caught.value)


def test_unknown_task_is_a_usage_error(run_dir, capsys):
    with pytest.raises(SystemExit) as caught:
        main(["eval", str(run_dir), "--tasks", "single-key,haystack", *FAST])
    assert caught.value.code == 2
    err = capsys.readouterr().err
    assert "unknown retrieval task(s) ['haystack']" in err and "Traceback" not in err


@pytest.mark.parametrize("kind", ["directory", "jsonl"])
def test_data_takes_a_directory_or_jsonl_like_train(run_dir, kind, tmp_path):
    lines = PROSE.splitlines(keepends=True)
    if kind == "directory":
        source = tmp_path / "prose-dir"
        source.mkdir()
        for part in range(4):
            (source / f"part{part}.txt").write_text("".join(lines[part::4]))
        extra = []
    else:
        source = tmp_path / "prose.jsonl"
        source.write_text("".join(json.dumps({"body": line}) + "\n" for line in lines))
        extra = ["--text-field", "body"]
    out = tmp_path / "out"
    assert main(["eval", str(run_dir), "--data", str(source), *extra, "--out", str(out), *FAST]) == 0
    data = json.loads((out / "results.json").read_text())["data"]
    assert data["kind"] == kind and data["tokens"] > 1000 and data["split"] == "all"
    # --split test evaluates only the source's held-out part (cut as the run's corpus was)
    assert main(["eval", str(run_dir), "--data", str(source), *extra, "--split", "test", "--out",
                 str(tmp_path / "held-out"), *FAST]) == 0
    held_out = json.loads((tmp_path / "held-out" / "results.json").read_text())["data"]
    assert held_out["split"] == "test" and 0 < held_out["tokens"] < data["tokens"]


def test_report_says_which_data_and_reads_older_results():
    from tapa.eval.report import merge_results, results_markdown

    def results(data, tasks=None):
        method = {"label": "TAPA", "run": "r", "train_len": 32, "zero_shot": True, "passkey": None,
                  "perplexity": [{"length": 32, "perplexity": 9.0, "buckets": [{"start": 0, "end": 32, "loss": 2.2}]}]}
        if tasks:
            method["tasks"] = tasks
        out = {"kind": "tapa-eval", "date": "2026-01-01", "hardware": "cpu", "command": "tapa eval r",
               "split": "all" if data else "test", "stride": 16, "max_tokens": 64, "methods": [method]}
        if data is not None:
            out["data"] = data
        return out

    prose = {"source": "prose.txt", "name": "prose.txt", "split": "all", "tokens": 5000, "run_corpus": False}
    own = {"source": "corpus.txt", "name": "corpus", "split": "test", "tokens": 800, "run_corpus": True}
    assert "Data: `prose.txt` (all of it, 5,000 tokens" in results_markdown(results(prose))
    assert "Data: several texts" in results_markdown(merge_results([results(prose), results(own)]))
    assert "Data: `prose.txt`" in results_markdown(merge_results([results(prose), results(dict(prose))]))
    # the same ids through another cache or tokenizer file (a converted model's): the same data
    hashed = dict(prose, token_sha256="ab" * 32, tokenizer={"from_run_cache": "/cache/a", "sha256": "1"})
    moved = dict(hashed, tokenizer={"from_model_dir": "/models/b", "sha256": "2"})
    assert "Data: `prose.txt`" in results_markdown(merge_results([results(hashed), results(moved)]))
    other = dict(moved, token_sha256="cd" * 32)
    assert "Data: several texts" in results_markdown(merge_results([results(hashed), results(other)]))
    # a grid written before the 'correct' counts: intervals from the accuracy and trials
    grid = {"lengths": [64], "depths": [0.0, 1.0], "trials": 4, "filler": "corpus", "accuracy": [[1.0, 0.5]]}
    markdown = results_markdown(results(None, tasks={"single-key": grid}))
    assert "Data: the test split." in markdown  # results.json of before --data
    assert "| 0% | 100% (51-100) |" in markdown and "| all depths | 75% (41-93) |" in markdown


def test_report_pools_the_depths_beyond_a_hybrids_local_window():
    """A hybrid's grids get a row over the depths whose needle lies beyond its local window (what
    its global layers retrieve); an all-global model's do not, nor a grid whose every depth is
    beyond the window (the row would repeat "all depths")."""
    from tapa.eval.report import grid_table, local_window, results_markdown

    grid = {"lengths": [512, 4096], "depths": [0.0, 0.5, 0.9, 1.0], "trials": 10, "filler": "corpus",
            "correct": [[0, 2, 8, 10], [1, 1, 9, 10]],
            "accuracy": [[0.0, 0.2, 0.8, 1.0], [0.1, 0.1, 0.9, 1.0]]}
    hybrid = {"layer_pattern": "LLLG", "local_window": 256}
    assert local_window(hybrid) == 256 and local_window({"layer_pattern": "G", "local_window": 256}) == 0
    table = grid_table("hybrid", grid, window=local_window(hybrid))
    # at 512 only depth 0 is more than 256 tokens back (0 of 10; 0.5 is 256 back, not beyond); at
    # 4096 depths 0, 0.5 and 0.9 are (11 of 30)
    assert "| beyond the 256-token window | 0% (0-28) | 37% (22-54) |" in table
    assert "beyond" not in grid_table("global", grid)
    assert "beyond" not in grid_table("hybrid", dict(grid, lengths=[4096, 8192], depths=[0.0, 0.25, 0.5, 0.75]),
                                      window=256)
    method = {"label": "TAPA hybrid", "run": "r", "train_len": 32, "zero_shot": True, **hybrid,
              "passkey": grid, "tasks": {"single-key": grid},
              "perplexity": [{"length": 32, "perplexity": 9.0, "buckets": [{"start": 0, "end": 32, "loss": 2.2}]}]}
    markdown = results_markdown({"kind": "tapa-eval", "date": "2026-01-01", "hardware": "cpu",
                                 "command": "tapa eval r", "split": "test", "stride": 16,
                                 "max_tokens": 64, "methods": [method]})
    assert markdown.count("| beyond the 256-token window |") == 2  # the passkey grid and the task


def test_the_token_digest_names_the_ids_not_their_storage():
    import hashlib

    import numpy as np

    from tapa.eval.evaluate import token_digest

    ids = np.arange(3000, dtype=np.uint16) % 777
    want = hashlib.sha256(ids.astype(np.int64).tobytes()).hexdigest()
    assert token_digest(ids) == token_digest(ids.astype(np.int32), chunk=7) == want
    changed = ids.copy()
    changed[1234] += 1
    assert token_digest(changed) != want


def test_report_reads_a_run_evaluated_only_on_other_text(tmp_path, capsys):
    """`tapa eval A B --data SRC` ends with 'compare them ... with: tapa report A B'; that report
    said "no evaluation results under 'A': run 'tapa eval A' first", as it read only RUN/eval. It
    now reads a run's one RUN/eval-<data>, and names the folders when there are several."""
    from helpers import one_line_error

    def write(folder, source, perplexity):
        method = {"label": "TAPA", "run": folder.parent.name, "train_len": 32, "zero_shot": True,
                  "passkey": None, "perplexity": [{"length": 32, "perplexity": perplexity, "loss": 2.0,
                                                   "buckets": [{"start": 0, "end": 32, "loss": 2.2}]}]}
        folder.mkdir(parents=True)
        (folder / "results.json").write_text(json.dumps({
            "kind": "tapa-eval", "date": "2026-01-01", "hardware": "cpu", "command": "tapa eval",
            "split": "all", "stride": 16, "max_tokens": 64, "methods": [method],
            "data": {"source": source, "name": source, "split": "all", "tokens": 5000, "run_corpus": False}}))

    a, b = tmp_path / "a", tmp_path / "b"
    write(a / "eval-prose.txt", "prose.txt", 9.0)
    write(b / "eval-prose.txt", "prose.txt", 11.0)
    assert main(["report", str(a), str(b), "--out", str(tmp_path / "report")]) == 0
    merged = json.loads((tmp_path / "report" / "results.json").read_text())
    assert [m["perplexity"][0]["perplexity"] for m in merged["methods"]] == [9.0, 11.0]
    assert merged["data"]["source"] == "prose.txt"
    write(a / "eval-notes.txt", "notes.txt", 7.0)
    one_line_error(["report", str(a), str(b), "--out", str(tmp_path / "report2")],
                   f"'{a}' was evaluated on 2 texts \\({a}/eval-notes.txt, {a}/eval-prose.txt\\); pass the "
                   "folder of the one to compare")
    # RUN/eval, the run's own corpus, stays what RUN means
    write(a / "eval", "corpus.txt", 5.0)
    assert main(["report", str(a), "--out", str(tmp_path / "report3")]) == 0
    assert json.loads((tmp_path / "report3" / "results.json").read_text())["data"]["source"] == "corpus.txt"
