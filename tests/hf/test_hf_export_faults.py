"""`tapa export` and `tapa convert` never destroy what they did not write, never keep a stale
tokenizer, never silently drop the tokenizer, and write files readable like any other."""

import json
import os
import shutil

import pytest
import torch

pytest.importorskip("transformers")
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM  # noqa: E402

from helpers import python_like_text, tiny_run

from tapa.cli import main  # noqa: E402

TEXT = python_like_text(2000)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A 2-step run with its token cache (BPE-300)."""
    return tiny_run(tmp_path_factory.mktemp("export_faults"))


@pytest.fixture
def other_tokenizer(tmp_path):
    """A tokenizer of another vocabulary size (what a stale export would keep)."""
    from transformers import PreTrainedTokenizerFast

    from tapa.data.tokenizer import EOT_TOKEN, train_bpe

    tokenizer = PreTrainedTokenizerFast(tokenizer_object=train_bpe([TEXT] * 2, 400, progress=False),
                                        eos_token=EOT_TOKEN)
    tokenizer.save_pretrained(tmp_path / "tok400")
    return tmp_path / "tok400"


def test_export_into_a_run_directory_is_refused(run_dir):
    before = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()}
    for flags in ([], ["--overwrite"]):
        with pytest.raises(SystemExit, match="is a training run directory"):
            main(["export", str(run_dir), str(run_dir), *flags])
    assert {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()} == before


def test_other_files_need_overwrite_and_survive_it(run_dir, tmp_path):
    out = tmp_path / "hf"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(SystemExit, match=r"did not write \(notes.txt\).*--overwrite"):
        main(["export", str(run_dir), str(out)])
    assert main(["export", str(run_dir), str(out), "--overwrite"]) == 0
    assert (out / "notes.txt").read_text() == "mine" and (out / "model.safetensors").is_file()
    (out / "notes.txt").unlink()
    assert main(["export", str(run_dir), str(out)]) == 0  # an earlier export alone: no flag needed


def test_reexport_replaces_the_tokenizer_and_a_missing_one_is_an_error(run_dir, other_tokenizer, tmp_path):
    out = tmp_path / "hf"
    assert main(["export", str(run_dir), str(out), "--tokenizer", str(other_tokenizer)]) == 0
    assert len(AutoTokenizer.from_pretrained(out)) == 400
    assert main(["export", str(run_dir), str(out)]) == 0
    assert len(AutoTokenizer.from_pretrained(out)) == 300  # the run's own, not the stale one

    cache = run_dir.parent / "cache"
    shutil.move(cache, run_dir.parent / "cache-moved")  # the run's token cache is gone
    try:
        with pytest.raises(SystemExit, match="token cache .*--tokenizer DIR, or --no-tokenizer"):
            main(["export", str(run_dir), str(tmp_path / "fresh")])
        assert not (tmp_path / "fresh").exists()
        assert main(["export", str(run_dir), str(out), "--no-tokenizer"]) == 0
    finally:
        shutil.move(run_dir.parent / "cache-moved", cache)
    assert not [p.name for p in out.iterdir() if "token" in p.name]  # no stale tokenizer files
    assert json.loads((out / "tapa_export.json").read_text())["tokenizer"] is None


def test_exported_files_have_the_default_mode(run_dir, tmp_path):
    previous = os.umask(0o022)
    try:
        assert main(["export", str(run_dir), str(tmp_path / "hf")]) == 0
    finally:
        os.umask(previous)
    modes = {p.name: oct(p.stat().st_mode & 0o777) for p in (tmp_path / "hf").iterdir()}
    assert set(modes.values()) == {"0o644"}, modes


def test_a_failed_export_keeps_the_earlier_one(run_dir, tmp_path, monkeypatch):
    import tapa.hf.export as export

    out = tmp_path / "hf"
    assert main(["export", str(run_dir), str(out)]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def fail(*args, **kwargs):
        raise RuntimeError("export check failed")

    monkeypatch.setattr(export, "verify_export", fail)
    with pytest.raises(RuntimeError):
        main(["export", str(run_dir), str(out), "--dtype", "bfloat16"])
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_convert_follows_the_same_rule(tmp_path):
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(tmp_path / "llama")
    with pytest.raises(SystemExit, match="must differ from LLAMA_DIR"):
        main(["convert", str(tmp_path / "llama"), str(tmp_path / "llama"), "--overwrite"])
    shutil.copytree(tmp_path / "llama", tmp_path / "llama-copy")  # another program's model directory
    with pytest.raises(SystemExit, match=r"tapa convert did not write \(config.json"):
        main(["convert", str(tmp_path / "llama"), str(tmp_path / "llama-copy")])
    assert main(["convert", str(tmp_path / "llama"), str(tmp_path / "tapa")]) == 0
    assert main(["convert", str(tmp_path / "llama"), str(tmp_path / "tapa"), "--theta", "0.25"]) == 0
    assert json.loads((tmp_path / "tapa" / "config.json").read_text())["theta"] == 0.25


def test_export_prints_its_result_and_no_loading_bar(run_dir, tmp_path, capfd):
    """The check's reload printed transformers' 'Loading weights: 100%|####| 38/38 ...' bar to
    stderr; export now prints its two lines and nothing else, and leaves the bar enabled."""
    from transformers.utils import logging as hf_logging

    assert main(["export", str(run_dir), str(tmp_path / "hf")]) == 0
    out, err = capfd.readouterr()
    assert err == "" and out.startswith(f"exported {run_dir} -> {tmp_path / 'hf'} (logits checked")
    assert hf_logging.is_progress_bar_enabled()
