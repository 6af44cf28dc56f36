"""Training configuration: the typed TrainConfig, named recipes, and the rules for continual
pretraining (which model fields may change when a checkpoint continues at a new length).

A recipe is a TOML file with up to three tables, one per config dataclass:

    [model]   fields of tapa.model.ModelConfig (vocab_size excluded: it follows the tokenizer)
    [data]    fields of tapa.data.DataConfig
    [train]   fields of TrainConfig

Precedence: dataclass defaults < recipe < command-line flags.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from pathlib import Path

try:  # Python 3.11+
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    tomllib = None

from tapa._config import check_types, documented, from_dict
from tapa.data import DataConfig
from tapa.model import ModelConfig
from tapa.positional.kinds import ROPE_FAMILY

PRECISIONS = ("auto", "fp32", "bf16")
PARALLEL_MODES = ("auto", "none", "ddp", "fsdp")

# Fields a continual run may change: the RoPE family's scaling (and which RoPE variant carries it),
# the global layers' query temperature (like the scaling, a function of position without weights),
# and how attention is computed. Everything else (shapes, vocabulary, TAPA's theta/alpha/distance/
# phase, init-only settings) is fixed by the checkpoint.
CONTINUAL_MUTABLE = ("rope_base", "rope_scale", "original_seq_len", "yarn_beta_fast",
                     "yarn_beta_slow", "query_temperature_base", "query_temperature_scale", "attn_impl")

# TrainConfig fields a resumed run may change without changing the loss trajectory.
RESUME_MUTABLE = ("name", "run_dir", "steps", "stop_after", "eval_every", "save_every", "keep_checkpoints",
                  "log_every", "progress", "compile", "deterministic", "device", "parallel", "cp", "micro_batch_size",
                  "resume", "plot")


FLOAT_FIELDS = ("lr", "phase_lr_scale", "min_lr_ratio", "weight_decay", "beta1", "beta2",
                "grad_clip", "passkey_fraction")


@dataclass
class TrainConfig:
    """How to train. Batch sizes count sequences of `seq_len` tokens.

    batch_size is the global batch per optimizer step, whatever the number of processes;
    micro_batch_size is what one process feeds the model at once (None: batch_size / world size),
    and gradient accumulation makes up the difference.
    Learning rate: linear warmup over warmup_steps to lr, then cosine down to lr * min_lr_ratio at
    `steps`. The TAPA phase rows of W_q / W_k (and a learnable phase matrix N) learn at
    lr * phase_lr_scale (their own optimizer parameter groups).
    """

    name: str = documented("run", "run name, used in the default run directory and in plots")
    run_dir: str | None = documented(None, "where the run's config, metrics and checkpoints go "
                                       "(None: runs/<name>-<pe>-<seq_len>)")
    seq_len: int = documented(256, "training sequence length in tokens")
    batch_size: int = documented(8, "global batch per optimizer step, in sequences, whatever the "
                                "number of processes")
    micro_batch_size: int | None = documented(None, "sequences one process feeds the model at once; "
                                                "gradient accumulation makes up the batch (None: "
                                                "batch_size / number of processes)")
    steps: int = documented(200, "optimizer steps of the run; the learning-rate schedule ends here")
    stop_after: int | None = documented(None, "stop (with a checkpoint) after this step, keeping the "
                                          "schedule of `steps`; resume later with --resume")
    lr: float = documented(1e-3, "peak learning rate (AdamW), reached after warmup_steps")
    phase_lr_scale: float = documented(0.1, "multiplies the learning rate of the TAPA phase rows of "
                                        "W_q/W_k and of a learnable phase matrix N; 1.0 = one "
                                        "learning rate for all parameters")
    min_lr_ratio: float = documented(0.1, "the cosine schedule ends at lr * min_lr_ratio")
    warmup_steps: int = documented(20, "steps of linear learning-rate warmup from lr / warmup_steps")
    weight_decay: float = documented(0.1, "AdamW weight decay on matrices and embeddings (none on "
                                      "norms and vectors)")
    beta1: float = documented(0.9, "AdamW beta1")
    beta2: float = documented(0.95, "AdamW beta2")
    grad_clip: float = documented(1.0, "clip the global gradient norm to this; 0 disables clipping")
    seed: int = documented(0, "seed of the initial weights and of the data order")
    precision: str = documented("auto", "auto: bf16 autocast on CUDA, fp32 on CPU")
    compile: bool = documented(False, "torch.compile each decoder block")
    deterministic: bool = documented(False, "torch's strict deterministic algorithms for the run "
                                     "(torch.use_deterministic_algorithms): TAPA's dQ by its "
                                     "ordered kernel instead of float atomics, SDPA by its "
                                     "deterministic backends, cuBLAS with a fixed workspace "
                                     "(CUBLAS_WORKSPACE_CONFIG); an op with no deterministic "
                                     "version stops the run, naming itself")
    parallel: str = documented("auto", "data parallelism under torchrun; auto: ddp with more than "
                                   "one process, else none")
    cp: int = documented(1, "context parallelism: each row is cut over this many processes (of "
                            "torchrun's, a multiple of cp; the rest is data parallelism), each "
                            "holding 2 of its 2 x cp equal chunks; seq_len must be a multiple of "
                            "2 x cp. Works with --doc-mask")
    device: str = documented("auto", "torch device; auto: cuda:<local rank> if CUDA is available, "
                                 "else cpu")
    log_every: int = documented(10, "write a metrics record (mean training loss since the previous "
                                "one) every this many steps")
    eval_every: int = documented(100, "validation loss every this many steps (0: only at the end)")
    eval_batches: int = documented(4, "validation batches (of batch_size sequences) per evaluation")
    save_every: int = documented(100, "checkpoint every this many steps (0: only at the end)")
    keep_checkpoints: int = documented(2, "how many of the newest checkpoints to keep")
    init_from: str | None = documented(None, "continual pretraining: start from the weights of this "
                                         "run or checkpoint directory (its model config; flags "
                                         "may change only what continual pretraining allows), "
                                         "with a fresh optimizer at the lr where its schedule "
                                         "ended (lr x min_lr_ratio) unless --lr is given")
    resume: bool = documented(False, "continue the run in run_dir from its latest checkpoint, "
                                 "exactly as if uninterrupted")
    passkey_fraction: float = documented(0.0, "share of training sequences replaced by passkey "
                                          "retrieval samples")
    doc_mask: bool = documented(False, "document masking: no token attends across the end-of-text "
                                  "token that ends its document (TAPA layers by the varlen op; "
                                  "RoPE positions restart at each document)")
    activation_checkpointing: bool = documented(False, "recompute each block's activations in the "
                                                "backward pass instead of keeping them: long "
                                                "rows in less memory, for about a third more "
                                                "compute")
    checkpoint_blocks: int = documented(0, "with activation_checkpointing: recompute only the "
                                           "first N blocks and keep the others' activations "
                                           "(selective: less recompute where the memory allows); "
                                           "0: every block")
    progress: bool = documented(True, "show a progress bar")
    plot: bool = documented(True, "write a loss-curve PNG into the run directory (needs matplotlib)")

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        positive = ("seq_len", "batch_size", "steps", "eval_batches", "keep_checkpoints",
                    "log_every", "cp")
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        for name in ("warmup_steps", "eval_every", "save_every", "checkpoint_blocks"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")
        for name in ("micro_batch_size", "stop_after"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                      or value <= 0):
                raise ValueError(f"{name} must be a positive int or None, got {value!r}")
        if self.stop_after is not None and self.stop_after > self.steps:
            raise ValueError(f"stop_after ({self.stop_after}) is past the run's last step ({self.steps}), so it "
                             "would never stop it early; drop --stop-after or raise --steps")
        for name in FLOAT_FIELDS:  # also catches nan, which passes every comparison below
            value = getattr(self, name)
            if (not isinstance(value, (int, float)) or isinstance(value, bool)
                    or not math.isfinite(value)):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr!r}")
        if self.phase_lr_scale < 0:
            raise ValueError(f"phase_lr_scale must be >= 0, got {self.phase_lr_scale!r}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio!r}")
        for name in ("beta1", "beta2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)!r}")
        for name in ("weight_decay", "grad_clip"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        if not 0.0 <= self.passkey_fraction <= 1.0:
            raise ValueError(f"passkey_fraction must be in [0, 1], got {self.passkey_fraction!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")
        if self.parallel not in PARALLEL_MODES:
            raise ValueError(f"parallel must be one of {PARALLEL_MODES}, got {self.parallel!r}")
        if self.checkpoint_blocks and not self.activation_checkpointing:
            raise ValueError(f"checkpoint_blocks ({self.checkpoint_blocks}) selects the blocks that "
                             "activation checkpointing recomputes: add --activation-checkpointing")
        if self.cp > 1 and self.seq_len % (2 * self.cp):
            raise ValueError(f"seq_len ({self.seq_len}) must be a multiple of 2 x cp = {2 * self.cp}: "
                             "context parallelism cuts each row into 2 x cp equal chunks")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> "TrainConfig":
        return from_dict(cls, values)

    @classmethod
    def from_saved(cls, values: dict) -> "TrainConfig":
        """The TrainConfig of a saved run (config.json or a checkpoint's state.json)."""
        return from_dict(cls, saved_train_values(values))


def saved_train_values(values: dict) -> dict:
    """A saved run's train settings in today's fields. Runs saved before phase_lr_scale existed
    trained every parameter at one learning rate: they keep 1.0, not today's default."""
    return {"phase_lr_scale": 1.0, **values}


# ---------------------------------------------------------------------------------------------
# Recipes

SECTIONS = {"model": ModelConfig, "data": DataConfig, "train": TrainConfig}


def recipe_dirs() -> list[Path]:
    """Where recipe names are looked up: $TAPA_RECIPES, the repository's recipes/, ./recipes."""
    dirs = []
    if os.environ.get("TAPA_RECIPES"):
        dirs.append(Path(os.environ["TAPA_RECIPES"]))
    dirs.append(Path(__file__).resolve().parents[3] / "recipes")  # src/tapa/train -> repo root
    dirs.append(Path.cwd() / "recipes")
    return dirs


def available_recipes() -> list[str]:
    names = set()
    for directory in recipe_dirs():
        if directory.is_dir():
            names.update(path.stem for path in directory.glob("*.toml"))
    return sorted(names)


def find_recipe(name_or_path: str) -> Path:
    """A recipe name (looked up in recipe_dirs()) or a path to a .toml file."""
    path = Path(name_or_path).expanduser()
    if path.suffix == ".toml" or os.sep in name_or_path:
        if not path.is_file():
            raise ValueError(f"recipe file {str(path)!r} does not exist")
        return path
    for directory in recipe_dirs():
        candidate = directory / f"{name_or_path}.toml"
        if candidate.is_file():
            return candidate
    raise ValueError(f"unknown recipe {name_or_path!r}; available: {available_recipes()} "
                     f"(searched {[str(d) for d in recipe_dirs()]}), or pass a path to a .toml file")


def load_recipe(name_or_path: str) -> dict[str, dict]:
    """Read a recipe into {"model": {...}, "data": {...}, "train": {...}}, fields checked."""
    if tomllib is None:  # pragma: no cover
        raise ImportError("reading recipes needs Python 3.11+ (tomllib)")
    path = find_recipe(name_or_path)
    try:
        with open(path, "rb") as handle:
            raw = tomllib.load(handle)
    except tomllib.TOMLDecodeError as err:
        raise ValueError(f"recipe {str(path)!r} is not valid TOML: {err}") from err
    unknown_sections = sorted(set(raw) - set(SECTIONS))
    if unknown_sections:
        raise ValueError(f"recipe {str(path)!r}: unknown tables {unknown_sections}; "
                         f"expected {list(SECTIONS)}")
    recipe = {}
    for section, cls in SECTIONS.items():
        table = raw.get(section, {})
        if not isinstance(table, dict):
            raise ValueError(f"recipe {str(path)!r}: {section} must be a table ([{section}])")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(table) - known)
        if unknown:
            raise ValueError(f"recipe {str(path)!r}: unknown [{section}] fields {unknown}")
        recipe[section] = check_types(cls, table, where=f"recipe {str(path)!r} [{section}] ")
    if "vocab_size" in recipe["model"]:
        raise ValueError(f"recipe {str(path)!r}: set vocab_size in [data]; the model's "
                         "vocabulary follows the tokenizer")
    recipe["train"].setdefault("name", path.stem)
    return recipe


def build_configs(recipe: dict[str, dict] | None = None,
                  overrides: dict[str, dict] | None = None
                  ) -> tuple[TrainConfig, ModelConfig, DataConfig]:
    """Merge defaults < recipe < overrides into the three typed configs."""
    merged = {}
    for section in SECTIONS:
        values = dict((recipe or {}).get(section, {}))
        values.update((overrides or {}).get(section, {}))
        merged[section] = values
    return (TrainConfig.from_dict(merged["train"]), ModelConfig.from_dict(merged["model"]),
            DataConfig.from_dict(merged["data"]))


def default_run_dir(train_cfg: TrainConfig, model_cfg: ModelConfig, data_cfg: DataConfig | None = None) -> Path:
    """runs/<name>-<pe>-<seq_len>, and -<data source> for a source other than the default
    "builtin" (so two runs on two texts do not share a directory)."""
    base = f"{train_cfg.name}-{model_cfg.pe}-{train_cfg.seq_len}"
    if data_cfg is not None and data_cfg.source != "builtin":
        base += f"-{data_slug(data_cfg.source)}"
    return Path("runs") / base


def data_slug(source: str) -> str:
    """A short file-name-safe name of a data source: 'corpus.txt', 'wiki' (a directory),
    'hf-wikitext' (hf:wikitext)."""
    import re

    if source.startswith("hf:"):
        raw = "hf-" + Path(source[3:].rstrip("/")).name
    else:
        raw = Path(source.rstrip("/")).expanduser().name or source
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", raw).strip("-.")[:48] or "data"


# ---------------------------------------------------------------------------------------------
# Continual pretraining and resume: what may change

def continual_model_config(base: ModelConfig, requested: dict) -> ModelConfig:
    """The model config of a continual run: the checkpoint's `base`, with the `requested` values
    (from a recipe or the command line) applied where they may change.

    May change: CONTINUAL_MUTABLE (RoPE scaling, the query temperature, attn_impl) and the RoPE
    variant within the RoPE family (e.g. rope -> rope-yarn). Any other requested value must equal
    the checkpoint's, else ValueError naming the field.
    """
    values = base.to_dict()
    for field, value in requested.items():
        if field not in values:
            raise ValueError(f"unknown ModelConfig field {field!r}")
        if value == values[field]:
            continue
        if field in CONTINUAL_MUTABLE:
            values[field] = value
        elif field == "pe" and base.pe in ROPE_FAMILY and value in ROPE_FAMILY:
            values[field] = value
        else:
            raise ValueError(
                f"continual pretraining keeps the checkpoint's {field}={values[field]!r}; "
                f"got {field}={value!r}. Only weightless settings ({', '.join(CONTINUAL_MUTABLE)}, "
                f"and pe within {'/'.join(ROPE_FAMILY)}) may change")
    return ModelConfig.from_dict(values)


def check_continual(base: ModelConfig, new: ModelConfig) -> None:
    """Raise ValueError if `new` differs from the checkpoint's `base` in a fixed field."""
    continual_model_config(base, new.to_dict())


def config_differences(saved: dict, current: dict, ignore=()) -> list[str]:
    """Fields whose values differ between two config dicts, as 'name: saved -> current'."""
    diffs = []
    for key in sorted(set(saved) | set(current)):
        if key in ignore:
            continue
        if saved.get(key) != current.get(key):
            diffs.append(f"{key}: {saved.get(key)!r} -> {current.get(key)!r}")
    return diffs


def check_checkpoint_blocks(train_cfg: TrainConfig, n_layers: int) -> None:
    """ValueError when --checkpoint-blocks asks for more blocks than the model has."""
    if train_cfg.checkpoint_blocks > n_layers:
        raise ValueError(f"checkpoint_blocks ({train_cfg.checkpoint_blocks}) is more than the model's "
                         f"{n_layers} blocks")
