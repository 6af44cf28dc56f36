"""Training: typed configs and recipes, the trainer (pretraining, continual pretraining, exact
resume), checkpoints, and torchrun data parallelism (DDP, FSDP2).

    from tapa.train import TrainConfig, train
    from tapa.model.loading import load_model
    run_dir = train(TrainConfig(steps=100), ModelConfig(), DataConfig())
    model, model_cfg, run_config = load_model(run_dir)

(load_model and CheckpointError are re-exported here from tapa.model.loading, which reads
checkpoints; this package writes them.)
"""

from tapa.model.loading import CheckpointError, load_model
from tapa.train.config import TrainConfig, build_configs, load_recipe
from tapa.train.trainer import train

__all__ = ["TrainConfig", "train", "load_model", "load_recipe", "build_configs", "CheckpointError"]
