"""`tapa export RUN_OR_CKPT OUT_DIR`: a training checkpoint -> a transformers model directory.

Lossless: the weights are copied as they are (float32 unless --dtype), and the exported model is
reloaded and checked to give logits identical to the training checkpoint's TapaLM. The run's
tokenizer (found through the run's data config, checked by sha256) is saved next to it as a
PreTrainedTokenizerFast, so AutoTokenizer, generate() and lm-eval work on the directory alone.

This command bridges training and transformers, so it reads checkpoints through `tapa.train`
(`load_model`) and tokenizers through `tapa.data`.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch

from tapa.hf.checkpoint import write_pretrained

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _find_tokenizer(run_config: dict) -> Path | None:
    """The run corpus' tokenizer.json if its cache still exists (and its sha256 matches)."""
    from tapa.data import DataConfig, find_corpus

    if "data" not in run_config:
        return None
    try:
        corpus = find_corpus(DataConfig.from_dict(run_config["data"]))
    except (ValueError, OSError):
        return None
    if corpus is None:
        return None
    path = corpus.tokenizer_dir / "tokenizer.json"
    expected = run_config.get("corpus", {}).get("tokenizer", {}).get("sha256")
    if not path.is_file() or (expected and hashlib.sha256(path.read_bytes()).hexdigest() != expected):
        return None
    return path


def save_tokenizer(tokenizer_json: Path, out_dir: Path, eot_token: str | None):
    """Wrap a `tokenizers` tokenizer.json as a transformers fast tokenizer in out_dir."""
    from transformers import PreTrainedTokenizerFast

    special = dict(eos_token=eot_token, pad_token=eot_token) if eot_token else {}
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(tokenizer_json), **special)
    tokenizer.save_pretrained(str(out_dir))
    return tokenizer


def export_checkpoint(path: str | Path, out_dir: str | Path, *, tokenizer: str | Path | None = None,
                      dtype: str = "float32", verify: bool = True) -> Path:
    """Export a run directory (its latest checkpoint) or a checkpoint directory to out_dir.

    tokenizer: a tokenizer directory or tokenizer.json; default: the run's own. Returns out_dir.
    """
    from tapa.train.checkpoint import load_model, resolve_checkpoint

    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {list(DTYPES)}, got {dtype!r}")
    checkpoint = resolve_checkpoint(path)
    lm, model_cfg, run_config = load_model(checkpoint)
    tokenizer_meta = run_config.get("corpus", {}).get("tokenizer", {})
    eot_id = tokenizer_meta.get("eot_id")
    out_dir = write_pretrained(out_dir, model_cfg, lm.state_dict(), dtype=DTYPES[dtype],
                               eos_token_id=eot_id, pad_token_id=eot_id, source=str(checkpoint))
    if tokenizer is not None:
        tokenizer_json = Path(tokenizer)
        tokenizer_json = tokenizer_json / "tokenizer.json" if tokenizer_json.is_dir() else tokenizer_json
        if not tokenizer_json.is_file():
            raise ValueError(f"tokenizer {str(tokenizer)!r}: no tokenizer.json there")
    else:
        tokenizer_json = _find_tokenizer(run_config)
    if tokenizer_json is not None:
        save_tokenizer(tokenizer_json, out_dir, tokenizer_meta.get("eot_token"))
    else:
        print("tapa export: the run's tokenizer was not found; pass --tokenizer DIR to include one")
    (out_dir / "tapa_export.json").write_text(json.dumps({
        "checkpoint": str(checkpoint.resolve()),
        "step": json.loads((checkpoint / "state.json").read_text()).get("step"),
        "dtype": dtype,
        "tokenizer": str(tokenizer_json) if tokenizer_json else None,
    }, indent=2))
    if verify:
        verify_export(lm, out_dir, exact=dtype == "float32")
    return out_dir


@torch.no_grad()
def verify_export(lm, out_dir: Path, *, exact: bool) -> None:
    """Reload out_dir with transformers and compare logits with the source TapaLM."""
    from tapa.hf.modeling import TapaForCausalLM

    model = TapaForCausalLM.from_pretrained(out_dir).eval()
    ids = torch.randint(0, lm.config.vocab_size, (2, 33), generator=torch.Generator().manual_seed(0))
    expected = lm(ids)
    actual = model(ids, use_cache=False).logits.to(expected.dtype)
    if exact and not torch.equal(actual, expected):
        raise RuntimeError(f"export check failed: logits differ by {(actual - expected).abs().max():.3g}")
    # a half-precision export rounds the weights: allow the logits to move by a few percent
    rel_error = float((actual.double() - expected.double()).norm() / expected.double().norm())
    if not exact and rel_error > 0.05:
        raise RuntimeError(f"export check failed: logits' relative RMSE {rel_error:.3g} > 0.05")


def add_arguments(parser) -> None:
    parser.add_argument("checkpoint", metavar="RUN_OR_CKPT",
                        help="run directory (uses its latest checkpoint) or checkpoint directory")
    parser.add_argument("out_dir", metavar="OUT_DIR", help="transformers model directory to write")
    parser.add_argument("--tokenizer", default=None,
                        help="tokenizer directory or tokenizer.json (default: the run's own)")
    parser.add_argument("--dtype", default="float32", choices=list(DTYPES),
                        help="weight dtype of the export (float32 is lossless)")
    parser.add_argument("--no-verify", dest="verify", action="store_false",
                        help="skip reloading the export and comparing logits")


def run(args) -> int:
    out_dir = export_checkpoint(args.checkpoint, args.out_dir, tokenizer=args.tokenizer,
                                dtype=args.dtype, verify=args.verify)
    checked = "logits checked identical" if args.verify and args.dtype == "float32" else "not bit-checked"
    print(f"exported {args.checkpoint} -> {out_dir} ({checked})")
    print(f"load with: AutoModelForCausalLM.from_pretrained({str(out_dir)!r}, trust_remote_code=True)")
    return 0
