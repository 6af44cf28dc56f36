"""Issue 34, the export cases: a bit flip in an exported model.safetensors is caught by the
project's transformers classes (case 6), and an export killed half-way (kill -9) is redone by the
same command (13). Each gave a silently wrong result, or a wrong refusal, before its fix."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from helpers import tiny_run  # noqa: E402

from tapa.cli import main  # noqa: E402

SRC = Path(__file__).resolve().parents[2] / "src"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A 2-step run with its token cache (BPE-300)."""
    return tiny_run(tmp_path_factory.mktemp("hf_integrity"))


@pytest.fixture(scope="module")
def exported(run_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("exports") / "hf"
    assert main(["export", str(run_dir), str(out)]) == 0
    return out


def _flip_a_bit(path: Path) -> None:
    """One bit of the last tensor's data (past the header): the file still parses."""
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x10
    path.write_bytes(bytes(data))


def test_a_bit_flip_in_the_exported_weights_is_caught_on_load(exported, tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from tapa.hf.modeling import TapaForCausalLM

    copy = tmp_path / "copy"
    copy.mkdir()
    for path in exported.iterdir():
        (copy / path.name).write_bytes(path.read_bytes())
    ids = torch.arange(12).view(1, 12)
    clean = TapaForCausalLM.from_pretrained(copy).eval()(ids, use_cache=False).logits
    _flip_a_bit(copy / "model.safetensors")
    message = r"model.safetensors' does not match its sha256 in tapa_checksums.json: it was corrupted"
    with pytest.raises(ValueError, match=message):
        TapaForCausalLM.from_pretrained(copy)
    with pytest.raises(ValueError, match=message):
        AutoModelForCausalLM.from_pretrained(copy, trust_remote_code=True)
    # plain safetensors readers are unaffected, and the check can be skipped on purpose
    assert load_file(copy / "model.safetensors")
    flipped = TapaForCausalLM.from_pretrained(copy, verify_checksums=False).eval()(ids, use_cache=False).logits
    assert not torch.equal(flipped, clean)


def test_save_pretrained_writes_checksums_of_its_own(exported, tmp_path):
    from tapa.hf.modeling import TapaForCausalLM

    model = TapaForCausalLM.from_pretrained(exported)
    out = tmp_path / "saved"
    (out).mkdir()
    (out / "tapa_checksums.json").write_text(json.dumps({"sha256": {"model.safetensors": "0" * 64}}))
    model.save_pretrained(out)
    sums = json.loads((out / "tapa_checksums.json").read_text())["sha256"]
    assert set(sums) == {p.name for p in out.glob("*.safetensors")}
    TapaForCausalLM.from_pretrained(out)  # no stale checksum blocks the load


def _killed_export(run_dir: Path, out: Path) -> subprocess.CompletedProcess:
    """`tapa export` killed with SIGKILL once the model is written, before the tokenizer is."""
    code = ("import os, signal, tapa.hf.export as e; "
            "e.save_tokenizer = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL); "
            "from tapa.cli import main; main()")
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    return subprocess.run([sys.executable, "-c", code, "export", str(run_dir), str(out)],
                          env=env, capture_output=True, text=True, timeout=300)


def test_an_export_killed_half_way_is_redone(run_dir, tmp_path):
    out = tmp_path / "hf"
    result = _killed_export(run_dir, out)
    assert result.returncode == -9, result.stderr
    assert (out / "model.safetensors").is_file() and not (out / "tokenizer.json").exists()
    assert main(["export", str(run_dir), str(out)]) == 0  # no --overwrite: it is the export's own
    names = sorted(p.name for p in out.iterdir())
    assert "tokenizer.json" in names and "tapa_export.json" in names
    assert not [name for name in names if name.startswith(".tapa-")]
    # killed while replacing a complete export: the next export again finishes the job
    result = _killed_export(run_dir, out)
    assert result.returncode == -9, result.stderr
    assert main(["export", str(run_dir), str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == names
    # a folder of another program's files is still refused
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text("{}")
    with pytest.raises(SystemExit, match="holds files tapa export did not write"):
        main(["export", str(run_dir), str(other)])
