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
import os
from dataclasses import dataclass
from pathlib import Path

try:  # Python 3.11+
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    tomllib = None

from tapa._config import from_dict
from tapa.data import DataConfig
from tapa.model import ModelConfig
from tapa.model.config import PE_CHOICES

PRECISIONS = ("auto", "fp32", "bf16")
PARALLEL_MODES = ("auto", "none", "ddp", "fsdp")

# Fields a continual run may change: the RoPE family's scaling (and which RoPE variant carries it),
# and how attention is computed. Everything else (shapes, vocabulary, TAPA's theta/alpha/distance/
# phase, init-only settings) is fixed by the checkpoint.
CONTINUAL_MUTABLE = ("rope_base", "rope_scale", "original_seq_len", "yarn_beta_fast",
                     "yarn_beta_slow", "attn_impl")

# TrainConfig fields a resumed run may change without changing the loss trajectory.
RESUME_MUTABLE = ("name", "run_dir", "steps", "stop_after", "eval_every", "save_every", "keep_checkpoints",
                  "log_every", "progress", "compile", "device", "parallel", "micro_batch_size",
                  "resume", "plot")


@dataclass
class TrainConfig:
    """How to train. Batch sizes count sequences of `seq_len` tokens.

    batch_size is the global batch per optimizer step, whatever the number of processes;
    micro_batch_size is what one process feeds the model at once (None: batch_size / world size),
    and gradient accumulation makes up the difference.
    Learning rate: linear warmup over warmup_steps to lr, then cosine down to lr * min_lr_ratio at
    `steps`.
    """

    name: str = "run"
    run_dir: str | None = None  # None: runs/<name>-<pe>-<seq_len>
    seq_len: int = 256
    batch_size: int = 8
    micro_batch_size: int | None = None
    steps: int = 200
    stop_after: int | None = None  # stop (with a checkpoint) after this step; schedule keeps `steps`
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 20
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0  # max global grad norm; 0 disables clipping
    seed: int = 0
    precision: str = "auto"  # auto: bf16 autocast on CUDA, fp32 on CPU
    compile: bool = False
    parallel: str = "auto"  # auto: ddp when launched by torchrun with >1 process, else none
    device: str = "auto"
    log_every: int = 10
    eval_every: int = 100  # 0: only at the end
    eval_batches: int = 4
    save_every: int = 100  # 0: only at the end
    keep_checkpoints: int = 2
    init_from: str | None = None  # run dir or checkpoint dir: continual pretraining
    resume: bool = False
    passkey_fraction: float = 0.0  # share of training sequences replaced by passkey samples
    progress: bool = True
    plot: bool = True  # loss-curve PNG in the run dir (needs matplotlib)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        positive = ("seq_len", "batch_size", "steps", "eval_batches", "keep_checkpoints",
                    "log_every")
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        for name in ("warmup_steps", "eval_every", "save_every"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")
        for name in ("micro_batch_size", "stop_after"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value <= 0):
                raise ValueError(f"{name} must be a positive int or None, got {value!r}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr!r}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio!r}")
        for name in ("beta1", "beta2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)!r}")
        if self.weight_decay < 0 or self.grad_clip < 0:
            raise ValueError("weight_decay and grad_clip must be >= 0")
        if not 0.0 <= self.passkey_fraction <= 1.0:
            raise ValueError(f"passkey_fraction must be in [0, 1], got {self.passkey_fraction!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")
        if self.parallel not in PARALLEL_MODES:
            raise ValueError(f"parallel must be one of {PARALLEL_MODES}, got {self.parallel!r}")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> "TrainConfig":
        return from_dict(cls, values)


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
    recipe = {section: dict(raw.get(section, {})) for section in SECTIONS}
    for section, cls in SECTIONS.items():
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(recipe[section]) - known)
        if unknown:
            raise ValueError(f"recipe {str(path)!r}: unknown [{section}] fields {unknown}")
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


def default_run_dir(train_cfg: TrainConfig, model_cfg: ModelConfig) -> Path:
    return Path("runs") / f"{train_cfg.name}-{model_cfg.pe}-{train_cfg.seq_len}"


# ---------------------------------------------------------------------------------------------
# Continual pretraining and resume: what may change

def _rope_family(pe: str) -> bool:
    return PE_CHOICES[pe][0] == "rope"


def continual_model_config(base: ModelConfig, requested: dict) -> ModelConfig:
    """The model config of a continual run: the checkpoint's `base`, with the `requested` values
    (from a recipe or the command line) applied where they may change.

    May change: RoPE scaling (CONTINUAL_MUTABLE) and the RoPE variant within the RoPE family
    (e.g. rope -> rope-yarn). Any other requested value must equal the checkpoint's, else
    ValueError naming the field.
    """
    values = base.to_dict()
    for field, value in requested.items():
        if field not in values:
            raise ValueError(f"unknown ModelConfig field {field!r}")
        if value == values[field]:
            continue
        if field in CONTINUAL_MUTABLE:
            values[field] = value
        elif field == "pe" and _rope_family(base.pe) and value in PE_CHOICES and _rope_family(value):
            values[field] = value
        else:
            raise ValueError(
                f"continual pretraining keeps the checkpoint's {field}={values[field]!r}; "
                f"got {field}={value!r}. Only the RoPE-family scaling ({', '.join(CONTINUAL_MUTABLE)}, "
                "and pe within rope/rope-pi/rope-ntk/rope-dynamic-ntk/rope-yarn) may change")
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
