"""`tapa eval` on what a user gets wrong: a folder of runs, another run's checkpoint, an output
folder of other files, a corrupted token cache."""

import json

import numpy as np
import pytest

from helpers import python_like_text

from tapa.cli import main

TEXT = python_like_text(2000)
FAST = ["--lengths", "16,32", "--stride", "16", "--max-tokens", "32", "--no-progress", "--device", "cpu"]


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory):
    """A folder laid out as `tapa demo` writes it: rope/ and tapa/ runs (2 steps each) and its
    merged results."""
    from tapa.data import DataConfig
    from tapa.model import ModelConfig
    from tapa.train import TrainConfig, train

    root = tmp_path_factory.mktemp("eval_faults")
    (root / "corpus.txt").write_text(TEXT)
    data_cfg = DataConfig(source=str(root / "corpus.txt"), cache_dir=str(root / "cache"), vocab_size=300,
                          val_fraction=0.1, test_fraction=0.1)
    demo = root / "demo-cpu"
    for pe in ("rope", "tapa"):
        train(TrainConfig(name=pe, run_dir=str(demo / pe), seq_len=32, batch_size=2, steps=2,
                          warmup_steps=1, eval_every=0, save_every=0, eval_batches=1, log_every=1,
                          progress=False, plot=False),
              ModelConfig(vocab_size=300, dim=32, n_layers=1, n_heads=2, pe=pe), data_cfg)
    (demo / "results.json").write_text(json.dumps({"kind": "tapa-eval"}))
    return demo


def test_a_folder_of_runs_evaluates_each_run(demo_dir, capsys):
    assert main(["eval", str(demo_dir), *FAST]) == 0
    captured = capsys.readouterr()
    assert "holds 2 runs" in captured.err and "tapa report" in captured.out
    for pe, label in (("rope", "RoPE"), ("tapa", "TAPA")):
        results = json.loads((demo_dir / pe / "eval" / "results.json").read_text())
        [method] = results["methods"]
        assert method["label"] == label and method["train_tokens"] == 2 * 2 * 32  # steps x batch x seq_len
    assert not (demo_dir / "eval").exists()


def test_a_checkpoint_of_another_run_is_refused(demo_dir):
    rope, tapa = demo_dir / "rope", demo_dir / "tapa"
    other = tapa / "checkpoints" / (tapa / "checkpoints" / "latest").read_text().strip()
    with pytest.raises(SystemExit, match=rf"--checkpoint '{other}' is not a checkpoint of '{rope}'; "
                                         rf"evaluate it as 'tapa eval {tapa} --checkpoint"):
        main(["eval", str(rope), "--checkpoint", str(other), *FAST])
    own = rope / "checkpoints" / (rope / "checkpoints" / "latest").read_text().strip()
    out = demo_dir.parent / "own-checkpoint"
    assert main(["eval", str(rope), "--checkpoint", str(own), "--out", str(out), *FAST]) == 0
    assert json.loads((out / "results.json").read_text())["methods"][0]["label"] == "RoPE"


def test_output_folders_of_other_files_and_runs_are_refused(demo_dir, tmp_path):
    rope = demo_dir / "rope"
    config = (demo_dir / "tapa" / "config.json").read_bytes()
    with pytest.raises(SystemExit, match="is a training run directory"):
        main(["eval", str(rope), "--out", str(demo_dir / "tapa"), "--overwrite", *FAST])
    assert (demo_dir / "tapa" / "config.json").read_bytes() == config
    (tmp_path / "notes.md").write_text("mine")
    with pytest.raises(SystemExit, match=r"did not write \(notes.md\)"):
        main(["eval", str(rope), "--out", str(tmp_path), *FAST])
    assert main(["eval", str(rope), "--out", str(tmp_path), "--overwrite", *FAST]) == 0
    assert (tmp_path / "notes.md").read_text() == "mine" and (tmp_path / "results.json").is_file()
    with pytest.raises(SystemExit, match="did not write"):  # a report into the demo's folder of runs
        main(["report", str(rope), "--out", str(demo_dir)])


def test_a_corrupted_token_cache_stops_the_evaluation(demo_dir):
    config = json.loads((demo_dir / "rope" / "config.json").read_text())
    from tapa.data import DataConfig, find_corpus

    corpus = find_corpus(DataConfig.from_dict(config["data"]))
    path = corpus.directory / "test.bin"
    original = path.read_bytes()
    ids = np.frombuffer(original, dtype=corpus.dtype).copy()
    ids[:64] = np.roll(ids[:64], 1)  # same size, same ids, other order: perplexity would change
    try:
        path.write_bytes(ids.tobytes())
        expected = f"test.bin does not match the sha256.*delete {corpus.directory}"
        with pytest.raises(SystemExit, match=expected):
            main(["eval", str(demo_dir / "rope"), "--out", str(demo_dir.parent / "corrupt"), *FAST])
    finally:
        path.write_bytes(original)
