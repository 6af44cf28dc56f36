"""Recipes, command-line overrides, and the continual-pretraining rules."""

import argparse
import dataclasses

import pytest
import torch

from tapa.model import ModelConfig, TapaLM
from tapa.train import command
from tapa.train.config import (TrainConfig, available_recipes, build_configs,
                               continual_model_config, load_recipe)


def _params(recipe: str) -> int:
    train_cfg, model_cfg, data_cfg = build_configs(load_recipe(recipe))
    model_cfg = dataclasses.replace(model_cfg, vocab_size=data_cfg.vocab_size)
    with torch.device("meta"):
        return TapaLM(model_cfg).num_parameters()


def test_required_recipes_exist_and_build():
    names = available_recipes()
    for required in ("tiny", "toy-gpu", "gpu-350m", "paper-7b"):
        assert required in names
    for name in names:
        train_cfg, model_cfg, data_cfg = build_configs(load_recipe(name))
        assert train_cfg.name == name


def test_recommended_hybrid_recipe_is_the_globals_studys_winner():
    """toy-gpu-hybrid-nope is the study's hybrid-nope-temp arm: LLLG over 8 layers (the last one
    global), window 256, NoPE globals, the query temperature based at the training length; and the
    TAPA hybrid's recipe differs from it only in the global layers' encoding and the temperature."""
    train_cfg, model_cfg, _ = build_configs(load_recipe("toy-gpu-hybrid-nope"))
    assert (model_cfg.pe, model_cfg.layer_pattern, model_cfg.local_window) == ("nope", "LLLG", 256)
    assert model_cfg.layer_kind(model_cfg.n_layers - 1) == "global"
    assert model_cfg.query_temperature_base == train_cfg.seq_len == 512
    tapa_train, tapa_model, _ = build_configs(load_recipe("toy-gpu-hybrid"))
    assert dataclasses.replace(model_cfg, pe="tapa", query_temperature_base=0) == tapa_model
    assert dataclasses.replace(train_cfg, name="toy-gpu-hybrid", phase_lr_scale=tapa_train.phase_lr_scale) == tapa_train


@pytest.mark.parametrize("recipe, low, high", [("tiny", 0.2e6, 3e6), ("toy-gpu", 20e6, 40e6),
                                                ("toy-gpu-hybrid-nope", 20e6, 40e6),
                                                ("gpu-350m", 300e6, 400e6),
                                                ("paper-7b", 6.5e9, 8.5e9)])
def test_recipe_sizes(recipe, low, high):
    assert low <= _params(recipe) <= high


def _parse(argv):
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    return parser.parse_args(argv)


def test_command_line_overrides_recipe():
    args = _parse(["--recipe", "tiny", "--pe", "rope", "--seq-len", "512", "--lr", "3e-4",
                   "--steps", "7", "--data", "/some/dir", "--vocab-size", "500", "--no-progress",
                   "--micro-batch-size", "none", "--rope-scale", "2"])
    train_cfg, model_cfg, data_cfg = command.configs_from_args(args)
    recipe = load_recipe("tiny")
    assert (model_cfg.pe, model_cfg.rope_scale, model_cfg.dim) == ("rope", 2.0, recipe["model"]["dim"])
    assert (train_cfg.seq_len, train_cfg.lr, train_cfg.steps, train_cfg.progress) == (512, 3e-4, 7, False)
    assert train_cfg.micro_batch_size is None
    assert train_cfg.batch_size == recipe["train"]["batch_size"]  # untouched values stay
    assert (data_cfg.source, data_cfg.vocab_size) == ("/some/dir", 500)


def test_local_window_flag_needs_a_local_layer():
    """--local-window on an all-global model used to be accepted and ignored."""
    with pytest.raises(ValueError, match="--local-window sizes local layers, but layer_pattern='G'"):
        command.configs_from_args(_parse(["--recipe", "tiny", "--pe", "rope", "--local-window", "64"]))
    _, model_cfg, _ = command.configs_from_args(
        _parse(["--recipe", "tiny", "--pe", "tapa", "--layer-pattern", "LLG", "--local-window", "64"]))
    assert model_cfg.local_window == 64


def test_bad_recipes_and_values(tmp_path):
    with pytest.raises(ValueError, match="unknown recipe 'no-such-recipe'"):
        load_recipe("no-such-recipe")
    with pytest.raises(ValueError, match="does not exist"):
        load_recipe(str(tmp_path / "missing.toml"))
    cases = {
        "syntax.toml": ("[train\nsteps = 1", "not valid TOML"),
        "table.toml": ("[optimizer]\nlr = 1.0", "unknown tables"),
        "field.toml": ("[train]\nlearning_rate = 1.0", r"unknown \[train\] fields \['learning_rate'\]"),
        "vocab.toml": ("[model]\nvocab_size = 100", "set vocab_size in \\[data\\]"),
    }
    for name, (text, message) in cases.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(ValueError, match=message):
            load_recipe(str(tmp_path / name))
    (tmp_path / "bad_value.toml").write_text("[train]\nlr = -1.0")
    with pytest.raises(ValueError, match="lr must be > 0"):
        build_configs(load_recipe(str(tmp_path / "bad_value.toml")))
    for bad, message in [(dict(seq_len=0), "seq_len"), (dict(precision="fp8"), "precision"),
                         (dict(parallel="tp"), "parallel"), (dict(passkey_fraction=2.0), "passkey"),
                         (dict(min_lr_ratio=1.5), "min_lr_ratio"), (dict(stop_after=0), "stop_after"),
                         (dict(steps=5, stop_after=6), r"stop_after \(6\) is past the run's last step \(5\)")]:
        with pytest.raises(ValueError, match=message):
            TrainConfig(**bad)
    with pytest.raises(SystemExit):  # argparse: not an int
        _parse(["--steps", "many"])


def test_continual_rules():
    tapa = ModelConfig(dim=32, n_heads=2, pe="tapa")
    assert continual_model_config(tapa, {"dim": 32, "pe": "tapa"}) == tapa
    assert continual_model_config(tapa, {"attn_impl": "reference"}).attn_impl == "reference"
    for field, value in [("theta", 0.25), ("alpha", 0.2), ("pe", "rope"), ("dim", 64),
                         ("pe", "tapa-linear-phase"), ("phase_init_scale", 0.5)]:
        with pytest.raises(ValueError, match=f"keeps the checkpoint's {field}="):
            continual_model_config(tapa, {field: value})
    rope = ModelConfig(dim=32, n_heads=2, pe="rope")
    yarn = continual_model_config(rope, {"pe": "rope-yarn", "rope_scale": 4.0, "original_seq_len": 256})
    assert (yarn.pe, yarn.rope_scale, yarn.original_seq_len) == ("rope-yarn", 4.0, 256)
    with pytest.raises(ValueError, match="pe="):
        continual_model_config(rope, {"pe": "tapa"})
    # the global layers' query temperature has no weights: a continual stage may add or change it
    hybrid = ModelConfig(dim=32, n_heads=2, pe="nope", n_layers=4, layer_pattern="LLLG")
    tempered = continual_model_config(hybrid, {"query_temperature_base": 512, "query_temperature_scale": 0.2})
    assert (tempered.query_temperature_base, tempered.query_temperature_scale) == (512, 0.2)
    with pytest.raises(ValueError, match="query_temperature_base"):
        continual_model_config(hybrid, {"query_temperature_base": -1})


def test_every_flag_has_a_sentence_and_its_default():
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    config_actions = [a for group in parser._action_groups if "Config;" in (group.title or "")
                      for a in group._group_actions]
    assert len(config_actions) > 50
    for action in config_actions:
        text = action.help or ""
        assert "(default: " in text, action.option_strings
        sentence = text.split("(default: ")[0].strip()
        # a sentence, not the bare field name ("model.dim") the flags used to show
        assert len(sentence.split()) >= 2 and not sentence.startswith(("model.", "data.", "train.",
                                                                     "ModelConfig.", "DataConfig.")), \
            (action.option_strings, text)
    phase = next(a for a in config_actions if "--phase-lr-scale" in a.option_strings)
    assert "(default: 0.1)" in phase.help and "learning rate" in phase.help
    init = next(a for a in config_actions if "--phase-init-scale" in a.option_strings)
    assert "(default: 0.1)" in init.help  # the recipe's value and the flag's agree


def test_list_recipes_shows_size_and_purpose(capsys):
    from tapa.cli import main

    assert main(["train", "--list-recipes"]) == 0
    lines = capsys.readouterr().out.splitlines()
    by_name = {line.split()[0]: line for line in lines}
    assert set(by_name) == set(available_recipes())
    for name, line in by_name.items():  # the size computed from the recipe's model config
        assert f" {command._human(_params(name))} parameters" in line
    assert "902K parameters" in by_name["tiny"] and "CPU demo" in by_name["tiny"]
    assert "toy study" in by_name["toy-gpu"] and "B parameters" in by_name["paper-7b"]


def test_ddp_in_one_process_says_it_trains_the_plain_model():
    """--parallel ddp without torchrun used to train one process without a word."""
    import torch

    from tapa.train.distributed import DistInfo
    from tapa.train.parallelize import resolve_parallel

    one = DistInfo(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"), initialized_here=False)
    with pytest.warns(UserWarning, match="--parallel ddp in a single process trains the plain model"):
        assert resolve_parallel("ddp", one) == "none"
    assert resolve_parallel("auto", one) == "none"  # auto: no word, nothing was asked for
