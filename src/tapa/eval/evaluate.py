"""Evaluate trained runs: perplexity vs length (and optionally passkey retrieval and the retrieval
tasks of `tapa.eval.tasks`) for the run's model and, for a RoPE model, the same weights under
eval-time scaling rules (PI, NTK, YaRN); for any model, optionally the same weights with the global
layers' log-length query temperature (`EvalOptions.query_temperature`).

The text is the run's own held-out split by default, or any source `tapa train --data` accepts
(`EvalOptions.data`), tokenized with the run's own tokenizer (`eval_tokens`).

The result is a plain dict (written to results.json by `tapa.eval.report`):

    {"kind": "tapa-eval", "date", "hardware", "command", "split", "stride", "max_tokens",
     "data": {"source", "split", "tokens", "run_corpus", ...},
     "methods": [{"label", "pe", "trained_pe", "variant", "query_temperature", "run", "train_len",
                  "zero_shot", "num_parameters",
                  "perplexity": [PerplexityResult.to_dict(), ...], "passkey": grid dict or None,
                  "tasks": {task: grid dict} or None}]}
"""

from __future__ import annotations

import datetime
import hashlib
import os
import platform
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from tapa.eval.passkey_eval import DEFAULT_DEPTHS, RETRIEVAL_BATCH_TOKENS, passkey_grid
from tapa.eval.perplexity import perplexity_vs_length
from tapa.eval.scaling import (ROPE_FAMILY, SCALED_AT_EVAL, check_query_temperature, with_positional,
                               with_query_temperature)
from tapa.eval.tasks import TASKS, TaskSettings, check_task_lengths, default_trials, task_grid
from tapa.positional.kinds import model_label, temperature_label

DEFAULT_MULTIPLES = (0.5, 1, 2, 4, 8, 16)


def lengths_from_multiples(train_len: int, multiples=DEFAULT_MULTIPLES) -> list[int]:
    return sorted({max(1, int(round(train_len * m))) for m in multiples})


SPLIT_CHOICES = ("val", "test", "all")


@dataclass
class EvalOptions:
    lengths: list[int] | None = None  # None: train_len * multiples
    multiples: tuple = DEFAULT_MULTIPLES
    stride: int = 256
    max_tokens: int | None = 16384  # tokens scored per length (a deterministic prefix of the split)
    split: str | None = None  # val | test | all (all: --data only); None: test, or all with data
    data: str | None = None  # a source as `tapa train --data` takes it; None: the run's own corpus
    text_field: str | None = None  # the text field of a .jsonl / hf data source (None: the run's)
    eval_pe: tuple = ()  # extra RoPE rules to evaluate a RoPE model under, e.g. ("rope-pi", "rope-yarn")
    # also evaluate the model with the global layers' query temperature at this base (positions; the
    # training length is the usual choice) and slope: ModelConfig.query_temperature_base / _scale
    query_temperature: int | None = None
    query_temperature_scale: float = 0.1
    passkey: bool = False
    passkey_lengths: list[int] | None = None  # None: train_len * (1, 2, 4, 8)
    passkey_depths: tuple = DEFAULT_DEPTHS
    passkey_trials: int = 5
    passkey_filler: str = "standard"  # standard | corpus
    tasks: tuple = ()  # retrieval tasks of tapa.eval.tasks.TASKS
    task_lengths: list[int] | None = None  # None: train_len * (1, 2, 4, 8)
    task_depths: tuple = DEFAULT_DEPTHS
    task_trials: int | None = None  # None: default_trials(len(task_depths)), +-5 points per length
    task_filler: str = "corpus"  # corpus | standard
    task_settings: TaskSettings = field(default_factory=TaskSettings)
    seed: int = 0
    tokens_per_batch: int = 16384  # perplexity windows a forward pass (their logits are held)
    retrieval_batch_tokens: int = RETRIEVAL_BATCH_TOKENS  # passkey and task prompts a forward pass
    progress: bool = True
    extra: dict = field(default_factory=dict)  # recorded as is (e.g. the demo's settings)

    def __post_init__(self):
        if self.split is None:
            self.split = "all" if self.data else "test"
        if self.split not in SPLIT_CHOICES:
            raise ValueError(f"split must be 'val' or 'test' (held-out) or 'all' (with data), got {self.split!r}")
        if self.split == "all" and not self.data:
            raise ValueError("split 'all' reads the whole of a --data source; the run's own corpus has only "
                             "'val' and 'test' held out (the rest is its training text)")
        for name in ("passkey_filler", "task_filler"):
            if getattr(self, name) not in ("standard", "corpus"):
                raise ValueError(f"{name} must be 'standard' or 'corpus', got {getattr(self, name)!r}")
        base = self.query_temperature  # None: off, and the scale is checked all the same
        check_query_temperature(1 if base is None else base, self.query_temperature_scale,
                                names=("query_temperature", "query_temperature_scale"))
        for pe in self.eval_pe:
            if pe not in ROPE_FAMILY:
                raise ValueError(f"eval_pe entries must be RoPE-family methods {ROPE_FAMILY}, got {pe!r}")
        # checked here, before any evaluation runs, rather than where each setting is read
        if self.lengths is None and (not self.multiples or not all(m > 0 for m in self.multiples)):
            # a multiple <= 0 would become a length of 1 token
            raise ValueError(f"multiples must be positive numbers, got {list(self.multiples)}")
        if self.passkey:
            if not self.passkey_depths or not all(0.0 <= d <= 1.0 for d in self.passkey_depths):
                raise ValueError(f"passkey_depths must be numbers in [0, 1], got {list(self.passkey_depths)}")
            if not isinstance(self.passkey_trials, int) or self.passkey_trials < 1:
                raise ValueError(f"passkey_trials must be an int >= 1, got {self.passkey_trials!r}")
        bad = [task for task in self.tasks if task not in TASKS]
        if bad:
            raise ValueError(f"unknown retrieval task(s) {bad}; choose from {', '.join(TASKS)}")
        if self.tasks:
            if not self.task_depths or not all(0.0 <= d <= 1.0 for d in self.task_depths):
                raise ValueError(f"task_depths must be numbers in [0, 1], got {list(self.task_depths)}")
            if self.task_trials is None:
                self.task_trials = default_trials(len(self.task_depths))
            if isinstance(self.task_trials, bool) or not isinstance(self.task_trials, int) or self.task_trials < 1:
                raise ValueError(f"task_trials must be an int >= 1, got {self.task_trials!r}")


def hardware_description(device: torch.device | str = "cpu") -> str:
    device = torch.device(device)
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} (CUDA), torch {torch.__version__}"
    cpu = platform.processor() or platform.machine()
    try:
        model_name = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                          if line.startswith("model name"))
        cpu = model_name
    except (OSError, StopIteration):
        pass
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (f"CPU {cpu}, {usable} of {os.cpu_count()} cores usable, {torch.get_num_threads()} torch threads, "
            f"torch {torch.__version__}")


def results_header(options: EvalOptions, device, data: dict | None = None) -> dict:
    now = datetime.datetime.now(datetime.timezone.utc)
    return {"kind": "tapa-eval", "date": now.isoformat(timespec="seconds"),
            "hardware": hardware_description(device), "command": " ".join(["tapa"] + sys.argv[1:]),
            "split": options.split, "stride": options.stride, "max_tokens": options.max_tokens,
            "data": data, "settings": options.extra, "methods": []}


def evaluate_model(model, tokens, *, train_len: int, options: EvalOptions, trained_pe: str | None = None,
                   run: str = "", zero_shot: bool = True, encode=None, decode=None, filler_ids=None,
                   filler_source: str | None = None, variant: str | None = None,
                   trained_temperature: tuple[int, float] | None = None) -> dict:
    """One method entry: perplexity at every length (and the passkey grid if options.passkey, a grid
    per retrieval task of options.tasks).

    filler_ids: the tokens corpus filler is drawn from (the evaluated text); filler_source: what to
    call them in the results (e.g. "corpus.txt"; default "corpus"). variant: what was changed at
    evaluation other than the RoPE rule, appended to the label (e.g. "query temperature 512").
    trained_temperature: the query temperature (base, scale) the run was trained with, named in the
    label (default: the model's own, which is the trained one unless `variant` changed it).

    train_len: the training sequence length of the run (lengths are multiples of it).
    For rope-pi/rope-ntk/rope-yarn the eval factor is length / (train_len / trained rope_scale),
    never below the trained factor: a model continued at 4L with PI factor 4 gets 8 at 8L.
    """
    pe = model.config.pe
    trained_pe = trained_pe or pe
    cfg = model.config
    if trained_temperature is None:
        trained_temperature = (cfg.query_temperature_base, cfg.query_temperature_scale)
    label = model_label(trained_pe, cfg.layer_pattern if cfg.is_hybrid else "G", cfg.local_window, eval_pe=pe,
                        query_temperature=trained_temperature)
    if variant:
        label = f"{label} + {variant}"
    scaling_len = train_len / cfg.rope_scale if pe in SCALED_AT_EVAL else train_len
    lengths = options.lengths or lengths_from_multiples(train_len, options.multiples)
    if (options.passkey or options.tasks) and encode is None:
        raise ValueError("passkey and retrieval-task evaluation need the tokenizer's encode function")
    if options.tasks and decode is None:
        raise ValueError("the retrieval tasks need the tokenizer's decode function to score answers")
    task_lengths = options.task_lengths or [train_len * m for m in (1, 2, 4, 8)]
    if options.tasks:  # before the perplexity, which can take long
        check_task_lengths(options.tasks, encode, task_lengths, options.task_settings,
                           train_len=None if options.task_lengths else train_len)
    perplexity = perplexity_vs_length(model, tokens, lengths=lengths, train_len=scaling_len,
                                      stride=options.stride, max_tokens=options.max_tokens,
                                      tokens_per_batch=options.tokens_per_batch,
                                      progress=options.progress, label=label)
    temperature = ({"base": cfg.query_temperature_base, "scale": cfg.query_temperature_scale}
                   if cfg.query_temperature_base else None)
    entry = {"label": label, "pe": pe, "trained_pe": trained_pe, "variant": variant,
             "query_temperature": temperature,
             "layer_pattern": cfg.layer_pattern,
             "local_window": cfg.local_window, "run": run, "train_len": train_len,
             "zero_shot": zero_shot, "num_parameters": model.num_parameters(),
             "perplexity": [r.to_dict() for r in perplexity], "passkey": None, "tasks": None}
    filler_name = filler_source or "corpus"
    if options.passkey:
        passkey_lengths = options.passkey_lengths or [train_len * m for m in (1, 2, 4, 8)]
        corpus_filler = options.passkey_filler == "corpus"
        entry["passkey"] = passkey_grid(
            model, encode, decode, lengths=passkey_lengths, depths=options.passkey_depths,
            trials=options.passkey_trials, seed=options.seed, filler_ids=filler_ids if corpus_filler else None,
            train_len=scaling_len, batch_tokens=options.retrieval_batch_tokens, progress=options.progress,
            label=label)
        if corpus_filler:
            entry["passkey"]["filler"] = filler_name
    if options.tasks:
        corpus_filler = options.task_filler == "corpus"
        entry["tasks"] = {task: task_grid(
            model, task, encode, decode, lengths=task_lengths, depths=options.task_depths,
            trials=options.task_trials, seed=options.seed, filler_ids=filler_ids if corpus_filler else None,
            settings=options.task_settings, train_len=scaling_len, batch_tokens=options.retrieval_batch_tokens,
            progress=options.progress, label=label, filler_name=filler_name if corpus_filler else "standard")
            for task in options.tasks}
    return entry


def data_name(source: str) -> str:
    """A short file-name-safe name of a data source: 'corpus.txt', 'wiki' (a directory),
    'hf-wikitext' (hf:wikitext), for the default output directory RUN/eval-<name>."""
    import re

    if source.startswith("hf:"):
        raw = "hf-" + Path(source[3:].rstrip("/")).name if source[3:].startswith((".", "/", "~")) \
            else "hf-" + source[3:]
    else:
        raw = Path(source.rstrip("/")).expanduser().name or source
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", raw).strip("-.")[:48] or "data"


def check_data_source(source: str, text_field: str = "text") -> None:
    """Open a --data source as `tapa train --data` would (without reading all of it): ValueError
    for a missing path, an empty file or directory, a .jsonl without text, an unloadable dataset."""
    from tapa.data import DataConfig
    from tapa.data.sources import open_source

    try:
        open_source(DataConfig(source=source, text_field=text_field, val_fraction=0.0, test_fraction=0.0))
    except ValueError as err:
        raise ValueError(f"--data {source}: {err}") from err


def run_tokenizer_corpus(run_config: dict, progress: bool):
    """The run's token cache, which holds its tokenizer (rebuilt as the default evaluation would
    when it is gone: the same source and settings give the same tokenizer, checked by its sha256
    against the one the run recorded)."""
    from tapa.data import DataConfig, build_corpus, find_corpus

    cfg = DataConfig.from_dict(run_config["data"])
    corpus = find_corpus(cfg) or build_corpus(cfg, progress=progress)
    expected = (run_config.get("corpus") or {}).get("tokenizer", {}).get("sha256")
    actual = corpus.manifest["tokenizer"].get("sha256")
    if expected and actual and expected != actual:
        raise ValueError(f"the run's token cache {corpus.directory} has another tokenizer (sha256 {actual[:12]}) "
                         f"than the run was trained with ({expected[:12]}); delete it and run again")
    return corpus


def eval_tokens(run_config: dict, options: EvalOptions):
    """(tokens, corpus, data description) of what `options` evaluates: the run's own corpus split,
    or options.data tokenized with the run's tokenizer (its `split`, 'all' = every split in order)."""
    from tapa.data import DataConfig, build_corpus
    from tapa.data.tokenizer import tokenizer_file

    if run_config.get("model_dir"):  # a transformers directory: its own tokenizer, the text of --data
        return _model_dir_tokens(Path(run_config["model_dir"]), options)
    if not options.data:
        corpus = build_corpus(DataConfig.from_dict(run_config["data"]), progress=options.progress)
        tokens = corpus.tokens(options.split)
        return tokens, corpus, {"source": corpus.manifest["source"].get("source"), "name": "corpus",
                                "split": options.split, "tokens": int(tokens.size), "run_corpus": True}
    run_corpus = run_tokenizer_corpus(run_config, options.progress)
    run_corpus.verify_tokenizer()  # its files tokenize --data: they must be the ones the run recorded
    run_data = DataConfig.from_dict(run_config["data"])
    all_text = options.split == "all"
    cfg = DataConfig(source=options.data, cache_dir=run_data.cache_dir,
                     tokenizer=str(run_corpus.tokenizer_dir),
                     text_field=options.text_field or run_data.text_field,
                     val_fraction=0.0 if all_text else run_data.val_fraction,
                     test_fraction=0.0 if all_text else run_data.test_fraction)
    tokens, corpus = _data_tokens(cfg, options)
    if all_text and _same_source(options.data, run_data.source):
        print(f"tapa eval: note: --data {options.data} is the run's own training source; --split all includes "
              "the text it was trained on (--split test evaluates its held-out part)", file=sys.stderr)
    return tokens, corpus, {
        "source": options.data, "name": data_name(options.data),
        "path": corpus.manifest["source"].get("path"),
        "kind": corpus.manifest["source"].get("kind"), "split": options.split,
        "tokens": int(tokens.size), "run_corpus": False, "text_field": cfg.text_field,
        "tokenizer": {"from_run_cache": str(run_corpus.directory),
                      "sha256": run_corpus.manifest["tokenizer"].get("sha256"),
                      "file": str(tokenizer_file(run_corpus.tokenizer_dir))},
        "cache": str(corpus.directory)}


def _data_tokens(cfg, options: EvalOptions):
    """(tokens, corpus) of --data built with cfg: the chosen split, or all of it."""
    from tapa.data import SPLITS, build_corpus

    try:
        corpus = build_corpus(cfg, progress=options.progress)
    except ValueError as err:
        raise ValueError(f"--data {options.data}: {err}") from err
    splits = SPLITS if options.split == "all" else (options.split,)
    parts = [part for part in (corpus.tokens(split) for split in splits) if part.size]
    if not parts:
        return np.empty(0, corpus.dtype), corpus
    return (parts[0] if len(parts) == 1 else np.concatenate(parts)), corpus


def _model_dir_tokens(model_dir: Path, options: EvalOptions):
    """eval_tokens of a transformers model directory: options.data tokenized with its tokenizer.json."""
    from tapa._paths import file_sha256
    from tapa.data import DataConfig
    from tapa.data.tokenizer import tokenizer_file

    defaults = DataConfig()
    all_text = options.split == "all"
    cfg = DataConfig(source=options.data, tokenizer=str(model_dir), text_field=options.text_field or "text",
                     val_fraction=0.0 if all_text else defaults.val_fraction,
                     test_fraction=0.0 if all_text else defaults.test_fraction)
    tokens, corpus = _data_tokens(cfg, options)
    file = tokenizer_file(model_dir)
    return tokens, corpus, {
        "source": options.data, "name": data_name(options.data),
        "path": corpus.manifest["source"].get("path"),
        "kind": corpus.manifest["source"].get("kind"), "split": options.split,
        "tokens": int(tokens.size), "run_corpus": False, "text_field": cfg.text_field,
        "tokenizer": {"from_model_dir": str(model_dir), "sha256": file_sha256(file), "file": str(file)},
        "cache": str(corpus.directory)}


def model_dir_run_config(model_dir: Path, model_cfg, options: EvalOptions, train_len: int | None = None) -> dict:
    """What evaluate_run reads of a run's config.json, for a transformers model directory (tapa
    convert / tapa export): the training length is `train_len`, else the seq_len of the run whose
    checkpoint was exported or converted (when that run directory is still there), else the model's
    original_seq_len (a converted Llama's max_position_embeddings). ValueError in one line without
    --data or a tokenizer.json."""
    from tapa.model.loading import read_json, run_config as run_config_of

    if not options.data:
        raise ValueError(f"{str(model_dir)!r} is a model directory, which carries no evaluation text; "
                         "pass --data SOURCE (a text file, a directory of files, a .jsonl, hf:NAME)")
    if not (model_dir / "tokenizer.json").is_file():
        raise ValueError(f"{str(model_dir)!r} has no tokenizer.json: the model directory's own tokenizer "
                         "tokenizes --data; export it with its tokenizer")
    convert_marker, export_marker = model_dir / "tapa_convert.json", model_dir / "tapa_export.json"
    record = (read_json(convert_marker, "conversion record") if convert_marker.is_file()
              else read_json(export_marker, "export record") if export_marker.is_file() else {})
    checkpoint = record.get("checkpoint")  # a tapa run's checkpoint (a converted Llama has none)
    source = run_config_of(Path(checkpoint)) if checkpoint and Path(checkpoint).is_dir() else {}
    source_len = (source.get("train") or {}).get("seq_len")
    # init_from marks a continual stage: a conversion trains nothing (its source is provenance,
    # not a stage), so a converted model is evaluated as zero-shot
    converted = convert_marker.is_file()
    return {"train": {"seq_len": int(train_len or source_len or model_cfg.original_seq_len)},
            "model_dir": str(model_dir), "init_from": None if converted else source.get("init_from"),
            "converted_from": record.get("from") if converted else None}


def _same_source(a: str, b: str) -> bool:
    if a == b:
        return True
    if a.startswith("hf:") or b.startswith("hf:") or "builtin" in (a, b):
        return False
    return Path(a).expanduser().resolve() == Path(b).expanduser().resolve()


def check_enough_tokens(n_tokens: int, lengths, data: dict) -> None:
    """ValueError when the text is too short for the longest perplexity length (a window of L
    inputs needs L + 1 tokens), saying how many it has and what is needed."""
    needed = max(lengths) + 1
    if n_tokens < needed:
        part = "all of it" if data["split"] == "all" else f"{data['split']} split"
        what = (f"--data {data['source']} ({part})" if not data.get("run_corpus")
                else f"the run's {data['split']} split")
        raise ValueError(f"{what} has {n_tokens:,} tokens with the run's tokenizer; perplexity at length "
                         f"{max(lengths)} needs at least {needed:,}: pass shorter --lengths (or --multiples) "
                         "or more text")


def token_digest(tokens, chunk: int = 1 << 20) -> str:
    """sha256 of the token ids evaluated (as int64, whatever dtype the cache stores): runs whose
    caches or tokenizer files differ (a converted model's own tokenizer.json, say) but that scored
    the same ids share it. A chunk at a time, so a large split's memmap is never copied whole."""
    digest = hashlib.sha256()
    tokens = np.asarray(tokens).reshape(-1)
    for start in range(0, tokens.size, chunk):
        digest.update(tokens[start:start + chunk].astype(np.int64).tobytes())
    return digest.hexdigest()


def check_finite_weights(model: torch.nn.Module, what: str) -> None:
    """ValueError naming the first parameters that hold nan or inf (a diverged checkpoint)."""
    bad = [name for name, tensor in model.state_dict().items()
           if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all())]
    if bad:
        shown = ", ".join(bad[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
        raise ValueError(f"{what} holds weights that are not finite (nan or inf in {shown}): the run "
                         "diverged before it was saved; use an earlier checkpoint")


def evaluate_run(run_dir: str | Path, options: EvalOptions, *, device: str | torch.device = "cpu",
                 checkpoint: str | Path | None = None, train_len: int | None = None) -> dict:
    """Evaluate the latest checkpoint of `run_dir` (or `checkpoint`) on the run's held-out split,
    or on options.data tokenized with the run's tokenizer. `run_dir` may also be a TAPA
    transformers model directory (tapa convert / tapa export): then options.data is required, its
    tokenizer.json tokenizes it, and `train_len` (or `model_dir_run_config`'s default) is the
    training length. A checkpoint whose weights are not finite is a ValueError."""
    from tapa.model.loading import is_model_dir, load_model, model_dir_config, read_state, resolve_checkpoint

    run_dir = Path(run_dir)
    if not (run_dir / "config.json").is_file():
        raise ValueError(f"run_dir {str(run_dir)!r} is not a training run (no config.json)")
    if is_model_dir(run_dir) and checkpoint is None:
        run_config = model_dir_run_config(run_dir, model_dir_config(run_dir), options, train_len)
        model, model_cfg, _ = load_model(run_dir, device=device)
        check_finite_weights(model, f"the model directory {str(run_dir)!r}")
    else:
        model, model_cfg, run_config = load_model(checkpoint or run_dir, device=device)
        step = read_state(resolve_checkpoint(checkpoint or run_dir), verify=False).get("step")
        check_finite_weights(model, f"the checkpoint of step {step} of {str(run_dir)!r}")
    train_len = int(run_config["train"]["seq_len"])
    tokens, corpus, data = eval_tokens(run_config, options)
    data["token_sha256"] = token_digest(tokens)
    lengths = options.lengths or lengths_from_multiples(train_len, options.multiples)
    check_enough_tokens(int(tokens.size), lengths, data)
    results = results_header(options, device, data)
    results["runs"] = [str(run_dir)]
    zero_shot = not run_config.get("init_from")
    variants = [(model, None)]
    if model_cfg.pe in ROPE_FAMILY:
        variants += [(with_positional(model, pe, train_len), None) for pe in options.eval_pe if pe != model_cfg.pe]
    base, scale = options.query_temperature, options.query_temperature_scale
    if base and (model_cfg.query_temperature_base, model_cfg.query_temperature_scale) != (base, scale):
        variants.append((with_query_temperature(model, base, scale), temperature_label(base, scale)))
    for variant, what in variants:
        results["methods"].append(evaluate_model(
            variant, tokens, train_len=train_len, options=options, trained_pe=model_cfg.pe,
            run=run_dir.name, zero_shot=zero_shot, encode=corpus.encode, decode=corpus.decode,
            filler_ids=tokens, filler_source=None if data["run_corpus"] else data["name"], variant=what,
            trained_temperature=(model_cfg.query_temperature_base, model_cfg.query_temperature_scale)))
    return results
