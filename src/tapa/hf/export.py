"""`tapa export RUN_OR_CKPT OUT_DIR`: a training checkpoint -> a transformers model directory.

Lossless: the weights are copied as they are (float32 unless --dtype), and the exported model is
reloaded and checked to give logits identical to the training checkpoint's TapaLM. The run's
tokenizer (found through the run's data config, checked by sha256) is saved next to it as a
PreTrainedTokenizerFast, so AutoTokenizer, generate() and lm-eval work on the directory alone; a
tokenizer that cannot be found is an error, unless --no-tokenizer says to export the model alone.
OUT_DIR follows the rule of `tapa._paths`: never a run directory or a path inside one (a step
folder), never over files of other programs without --overwrite, and a re-export replaces every
file of the earlier one, as does running an export again after it was killed half-way. A
checkpoint whose weights are not finite is refused. The export's tapa_checksums.json lets
`TapaForCausalLM.from_pretrained` check model.safetensors on every load.

It reads checkpoints through `tapa.model.loading` (`load_model`) and tokenizers through
`tapa.data`.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from tapa._paths import check_output_dir, file_sha256, replacing_outputs
from tapa.hf.writer import MODEL_FILES, TOKENIZER_FILES, write_pretrained

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
EXPORT_MARKER = "tapa_export.json"
EXPORT_FILES = (*MODEL_FILES, *TOKENIZER_FILES, EXPORT_MARKER)
_NO_TOKENIZER_HINT = "pass --tokenizer DIR, or --no-tokenizer to export the model alone"


def run_tokenizer(run_config: dict) -> Path:
    """The tokenizer.json of the run's token cache, checked against the run's sha256; ValueError
    saying why when it cannot be found."""
    from tapa.data import DataConfig, find_corpus

    if "data" not in run_config:
        raise ValueError(f"the checkpoint is not inside a run directory, so its tokenizer is unknown; "
                         f"{_NO_TOKENIZER_HINT}")
    try:
        corpus = find_corpus(DataConfig.from_dict(run_config["data"]))
    except (ValueError, OSError) as err:
        raise ValueError(f"the run's token cache cannot be found ({err}); {_NO_TOKENIZER_HINT}") from err
    if corpus is None:
        raise ValueError("the run's token cache is gone (rebuild it with 'tapa data build' and the "
                         f"\"data\" settings in the run's config.json); {_NO_TOKENIZER_HINT}")
    path = corpus.tokenizer_dir / "tokenizer.json"
    expected = run_config.get("corpus", {}).get("tokenizer", {}).get("sha256")
    if not path.is_file() or (expected and file_sha256(path) != expected):
        raise ValueError(f"{str(path)!r} is missing or not the tokenizer the run was trained with; "
                         f"{_NO_TOKENIZER_HINT}")
    return path


def given_tokenizer(tokenizer: str | Path) -> Path:
    """tokenizer.json of a tokenizer directory, or the file itself, checked to load as one."""
    from tapa.data.tokenizer import load_tokenizer

    path = Path(tokenizer).expanduser()
    path = path / "tokenizer.json" if path.is_dir() else path
    if not path.is_file():
        raise ValueError(f"tokenizer {str(tokenizer)!r}: no tokenizer.json there")
    try:
        load_tokenizer(path)
    except ValueError as err:
        raise ValueError(f"--tokenizer {str(tokenizer)!r} is not a tokenizer: {str(path)!r} does not load as a "
                         f"tokenizers tokenizer.json ({err.__cause__ or err}); pass a tokenizer directory "
                         "or its tokenizer.json") from err
    return path


def save_tokenizer(tokenizer_json: Path, out_dir: Path, eot_token: str | None):
    """Wrap a `tokenizers` tokenizer.json as a transformers fast tokenizer in out_dir.

    transformers writes its own tokenizer_config.json (eos and pad) and re-serializes
    tokenizer.json with a post-processor that adds no token; the source file is then copied back
    byte for byte. The ids are the same either way, but the token cache knows a tokenizer by its
    sha256: a model directory with the run's own file trains and evaluates on the run's cached
    tokens instead of tokenizing the corpus again."""
    from transformers import PreTrainedTokenizerFast

    special = dict(eos_token=eot_token, pad_token=eot_token) if eot_token else {}
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(tokenizer_json), **special)
    tokenizer.save_pretrained(str(out_dir))
    shutil.copyfile(tokenizer_json, Path(out_dir) / "tokenizer.json")
    return tokenizer


def export_checkpoint(path: str | Path, out_dir: str | Path, *, tokenizer: str | Path | None = None,
                      with_tokenizer: bool = True, dtype: str = "float32", verify: bool = True,
                      overwrite: bool = False) -> Path:
    """Export a run directory (its latest checkpoint) or a checkpoint directory to out_dir.

    tokenizer: a tokenizer directory or tokenizer.json; default: the run's own, and an error when
    it cannot be found, unless with_tokenizer=False. out_dir follows tapa._paths' rule (never a run
    directory; files of other programs only with overwrite=True); an earlier export there is
    replaced as a whole, so no file of it (a stale tokenizer) survives. Returns out_dir.
    """
    from tapa.model.loading import load_model, resolve_checkpoint

    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {list(DTYPES)}, got {dtype!r}")
    if tokenizer is not None and not with_tokenizer:
        raise ValueError("--tokenizer and --no-tokenizer contradict each other")
    out_dir = check_output_dir(out_dir, outputs=EXPORT_FILES, marker=EXPORT_MARKER, overwrite=overwrite,
                               command="tapa export")
    given = given_tokenizer(tokenizer) if tokenizer is not None else None  # before the model loads
    checkpoint = resolve_checkpoint(path)
    lm, model_cfg, run_config = load_model(checkpoint)
    bad = [name for name, t in lm.state_dict().items()
           if t.is_floating_point() and not bool(torch.isfinite(t).all())]
    if bad:
        raise ValueError(f"checkpoint {str(checkpoint)!r} holds weights that are not finite (nan or inf in "
                         f"{', '.join(bad[:3])}): the run diverged before it was saved; export an earlier "
                         "checkpoint")
    tokenizer_json = None
    if with_tokenizer:
        tokenizer_json = given if given is not None else run_tokenizer(run_config)
    tokenizer_meta = run_config.get("corpus", {}).get("tokenizer", {})
    eot_id = tokenizer_meta.get("eot_id")
    with replacing_outputs(out_dir, EXPORT_FILES) as out_dir:
        write_pretrained(out_dir, model_cfg, lm.state_dict(), dtype=DTYPES[dtype],
                         eos_token_id=eot_id, pad_token_id=eot_id, source=str(checkpoint))
        if tokenizer_json is not None:
            save_tokenizer(tokenizer_json, out_dir, tokenizer_meta.get("eot_token"))
        (out_dir / EXPORT_MARKER).write_text(json.dumps({
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
    from transformers.utils import logging as hf_logging

    from tapa.hf.modeling import TapaForCausalLM

    bar = hf_logging.is_progress_bar_enabled()  # transformers' "Loading weights" bar: not ours to show
    hf_logging.disable_progress_bar()
    try:
        model = TapaForCausalLM.from_pretrained(out_dir).eval()
    finally:
        if bar:
            hf_logging.enable_progress_bar()
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
                        help="tokenizer directory or tokenizer.json (default: the run's own; an error "
                             "if it is gone)")
    parser.add_argument("--no-tokenizer", dest="with_tokenizer", action="store_false",
                        help="export the model without a tokenizer")
    parser.add_argument("--overwrite", action="store_true",
                        help="write into OUT_DIR even if it holds files tapa export did not write "
                             "(never into a run directory)")
    parser.add_argument("--dtype", default="float32", choices=list(DTYPES),
                        help="weight dtype of the export (float32 is lossless)")
    parser.add_argument("--no-verify", dest="verify", action="store_false",
                        help="skip reloading the export and comparing logits")


def run(args) -> int:
    out_dir = export_checkpoint(args.checkpoint, args.out_dir, tokenizer=args.tokenizer,
                                with_tokenizer=args.with_tokenizer, dtype=args.dtype,
                                verify=args.verify, overwrite=args.overwrite)
    checked = "logits checked identical" if args.verify and args.dtype == "float32" else "not bit-checked"
    print(f"exported {args.checkpoint} -> {out_dir} ({checked})")
    print(f"load with: AutoModelForCausalLM.from_pretrained({str(out_dir)!r}, trust_remote_code=True)")
    return 0
