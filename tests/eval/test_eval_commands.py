"""`tapa eval`, `tapa report` and `tapa demo --tiny` produce their files, end to end on tiny models."""

import json

import pytest

from helpers import python_like_text

from tapa.cli import main

TEXT = python_like_text(3000)


@pytest.fixture(scope="module")
def tiny_runs(tmp_path_factory):
    """Two 3-step runs (RoPE, TAPA) on a small text file with a 300-token BPE."""
    from tapa.data import DataConfig
    from tapa.model import ModelConfig
    from tapa.train import TrainConfig, train

    root = tmp_path_factory.mktemp("eval_runs")
    (root / "corpus.txt").write_text(TEXT)
    data_cfg = DataConfig(source=str(root / "corpus.txt"), cache_dir=str(root / "cache"), vocab_size=300,
                          val_fraction=0.1, test_fraction=0.1)
    runs = {}
    for pe in ("rope", "tapa"):
        train_cfg = TrainConfig(name=pe, run_dir=str(root / pe), seq_len=32, batch_size=2, steps=3,
                                warmup_steps=1, eval_every=0, save_every=0, eval_batches=1, log_every=1,
                                progress=False, plot=False)
        model_cfg = ModelConfig(vocab_size=300, dim=32, n_layers=1, n_heads=2, pe=pe)
        runs[pe] = train(train_cfg, model_cfg, data_cfg)
    return runs


def test_eval_writes_tables_plots_and_json(tiny_runs, capsys):
    run_dir = tiny_runs["rope"]
    assert main(["eval", str(run_dir), "--lengths", "16,32,64", "--stride", "8", "--max-tokens", "96",
                 "--eval-pe", "rope-pi,rope-yarn", "--passkey", "--passkey-lengths", "256",
                 "--passkey-depths", "0,1", "--passkey-trials", "1", "--no-progress", "--device", "cpu"]) == 0
    out = run_dir / "eval"
    for name in ("results.json", "results.md", "perplexity.png", "position_loss.png", "passkey_rope.png",
                 "passkey_rope-pi.png"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    results = json.loads((out / "results.json").read_text())
    assert [m["label"] for m in results["methods"]] == ["RoPE", "RoPE+PI", "RoPE+YaRN"]
    pi = results["methods"][1]
    assert [r["length"] for r in pi["perplexity"]] == [16, 32, 64]
    assert [r["rope_scale"] for r in pi["perplexity"]] == [1.0, 1.0, 2.0]  # trained at 32
    assert all(r["tokens"] == 96 for r in pi["perplexity"])
    assert pi["zero_shot"] is True and pi["passkey"]["lengths"] == [256]
    markdown = (out / "results.md").read_text()
    assert "| RoPE+YaRN |" in markdown and "64 (2x)" in markdown and "Passkey" in markdown
    assert "| RoPE |" in capsys.readouterr().out


def test_report_merges_runs(tiny_runs, tmp_path):
    for run_dir in tiny_runs.values():
        if not (run_dir / "eval" / "results.json").is_file():
            assert main(["eval", str(run_dir), "--lengths", "32,64", "--stride", "16", "--max-tokens", "64",
                         "--no-progress", "--device", "cpu"]) == 0
    out = tmp_path / "report"
    assert main(["report", *map(str, tiny_runs.values()), "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    labels = [m["label"] for m in results["methods"]]
    assert "TAPA" in labels and "RoPE" in labels
    assert (out / "perplexity.png").stat().st_size > 0
    assert "| TAPA |" in (out / "results.md").read_text()
    with pytest.raises(SystemExit, match="run 'tapa eval"):
        main(["report", str(tmp_path), "--out", str(out)])


def test_demo_tiny_runs_end_to_end(tmp_path, monkeypatch, capsys):
    from tapa.eval.demo import DEMO_MODELS, PROFILES

    monkeypatch.setenv("TAPA_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "demo"
    assert main(["demo", "--tiny", "--out", str(out), "--no-progress", "--device", "cpu"]) == 0
    printed = capsys.readouterr().out
    hybrid = "TAPA hybrid (LLLG, w16)"  # the tiny profile trains at 32: window = half of it
    nope = "NoPE hybrid (LLLG, w16, query temperature 32)"
    assert "| RoPE |" in printed and "| TAPA |" in printed and f"| {hybrid} |" in printed
    assert f"| {nope} |" in printed
    assert "| RoPE+YaRN |" in printed and "perplexity.png" in printed
    assert "over perplexity at the training length: RoPE " in printed
    results = json.loads((out / "results.json").read_text())
    labels = [m["label"] for m in results["methods"]]
    assert set(labels) >= {"RoPE", "RoPE+PI", "RoPE+YaRN", "TAPA", hybrid, nope} and len(labels) == len(set(labels))
    assert results["settings"]["profile"]["name"] == "tiny"
    assert results["command"] == f"tapa demo --tiny --out {out} --device cpu"
    assert (out / "perplexity.png").stat().st_size > 0
    # every model trained with the profile's recipe: its lr, the TAPA phase rows at 0.1x, its pattern
    tiny = PROFILES["tiny"]
    for model in DEMO_MODELS:
        config = json.loads((out / model.name / "config.json").read_text())
        assert config["train"]["lr"] == tiny.lr[model.name] and config["train"]["phase_lr_scale"] == 0.1
        assert (config["model"]["pe"], config["model"]["layer_pattern"]) == (model.pe, model.layer_pattern)
        assert config["model"]["n_layers"] == tiny.n_layers and config["model"]["local_window"] == 16
        assert config["model"]["query_temperature_base"] == (32 if model.name == "hybrid-nope" else 0)
    # the corpus size and the epochs are reported, from the runs' data plan
    corpus = results["settings"]["corpus"]
    assert corpus["run_tokens"] == tiny.steps * tiny.batch_size * tiny.seq_len == 512
    assert corpus["train_tokens"] > 1000 and corpus["val_tokens"] > 0 and corpus["test_tokens"] > 0
    assert corpus["epochs"] == pytest.approx(512 / corpus["train_tokens"], rel=0.02)
    assert f"{corpus['train_tokens'] / 1e6:.2f}M train tokens" in printed and " epochs" in printed
    with pytest.raises(SystemExit, match="^tapa demo: error: .*--force"):
        main(["demo", "--tiny", "--out", str(out), "--no-progress", "--device", "cpu"])


@pytest.mark.parametrize("name", ["tiny", "cpu", "cuda"])
def test_demo_profiles_train_every_model_with_a_real_hybrid(name):
    """Every model has an lr; the hybrids' window is half the training length and their pattern
    leaves at least one global layer; the NoPE hybrid's query temperature is based at the training
    length; the cuda profile uses the toy study's learning rates."""
    from tapa.eval.demo import DEMO_MODELS, PROFILES, demo_configs

    profile = PROFILES[name]
    assert profile.local_window == profile.seq_len // 2 and profile.phase_lr_scale == 0.1
    labels = []
    for model in DEMO_MODELS:
        train_cfg, model_cfg, _ = demo_configs(profile, model, "unused", "cpu", False, None)
        assert train_cfg.lr == profile.lr[model.name] and train_cfg.phase_lr_scale == 0.1
        kinds = [model_cfg.layer_kind(i) for i in range(model_cfg.n_layers)]
        assert "global" in kinds and model_cfg.is_hybrid == model.name.startswith("hybrid")
        assert model_cfg.query_temperature_base == (profile.seq_len if model.name == "hybrid-nope" else 0)
        labels.append(model_cfg.label)
    window = profile.seq_len // 2
    assert labels == ["RoPE", "TAPA", f"TAPA hybrid (LLLG, w{window})",
                      f"NoPE hybrid (LLLG, w{window}, query temperature {profile.seq_len})"]
    if name == "cuda":  # results/toy-study/lr_sweep.md and the globals study's 1e-3 for both hybrids
        assert profile.lr == {"rope": 1e-3, "tapa": 2e-3, "hybrid": 1e-3, "hybrid-nope": 1e-3}
        assert profile.seq_len == 512
        assert profile.include_site_packages


def test_table_marks_continual_runs_and_mixed_training_lengths():
    from tapa.eval.report import perplexity_table

    def method(label, train_len, zero_shot):
        return {"label": label, "train_len": train_len, "zero_shot": zero_shot,
                "perplexity": [{"length": 128, "perplexity": 12.345}, {"length": 256, "perplexity": 2280.4}]}

    table = perplexity_table([method("RoPE", 128, True), method("TAPA", 128, False)])
    assert table.splitlines()[0] == "| method | stage | 128 (1x) | 256 (2x) |"
    assert table.splitlines()[2] == "| RoPE | zero-shot | 12.35 | 2280 |"
    assert table.splitlines()[3].startswith("| TAPA | continual |")
    table = perplexity_table([method("RoPE", 128, True), method("TAPA", 64, True)])
    assert table.splitlines()[0] == "| method | trained at | 128 | 256 |"


def test_continual_pi_model_keeps_its_trained_factor():
    """A PI model continued at 64 tokens with factor 4 (pretrained at 16) gets max(4, length / 16)."""
    import numpy as np
    import torch

    from tapa.eval.evaluate import EvalOptions, evaluate_model
    from tapa.model import ModelConfig, TapaLM

    torch.manual_seed(0)
    model = TapaLM(ModelConfig(vocab_size=50, dim=32, n_layers=1, n_heads=2, pe="rope-pi", rope_scale=4.0))
    tokens = np.random.default_rng(0).integers(0, 50, 400)
    entry = evaluate_model(model, tokens, train_len=64, zero_shot=False, options=EvalOptions(
        lengths=[32, 64, 128, 256], stride=32, max_tokens=64, progress=False))
    assert [r["rope_scale"] for r in entry["perplexity"]] == [4.0, 4.0, 8.0, 16.0]
    assert model.config.rope_scale == 4.0  # restored
    assert entry["label"] == "PI" and entry["zero_shot"] is False


def test_a_model_built_with_a_query_temperature_names_it_in_its_label():
    """Trained with the temperature: the label says so (else two runs that differ only there read
    alike); evaluated at another base as well: the trained one in the name, the new one appended."""
    import numpy as np
    import torch

    from tapa.eval.evaluate import EvalOptions, evaluate_model
    from tapa.eval.scaling import with_query_temperature
    from tapa.model import ModelConfig, TapaLM

    torch.manual_seed(0)
    cfg = dict(vocab_size=50, dim=32, n_layers=4, n_heads=2, pe="nope", layer_pattern="LLLG", local_window=8)
    plain = TapaLM(ModelConfig(**cfg))
    model = TapaLM(ModelConfig(**cfg, query_temperature_base=32, query_temperature_scale=0.2))
    assert plain.config.label == "NoPE hybrid (LLLG, w8)"
    assert model.config.label == "NoPE hybrid (LLLG, w8, query temperature 32 x0.2)"
    assert TapaLM(ModelConfig(vocab_size=50, dim=32, n_layers=1, n_heads=2, pe="tapa",
                              query_temperature_base=512)).config.label == "TAPA (query temperature 512)"
    tokens = np.random.default_rng(0).integers(0, 50, 200)
    options = EvalOptions(lengths=[64], stride=32, max_tokens=64, progress=False)
    entry = evaluate_model(model, tokens, train_len=32, options=options)
    assert entry["label"] == "NoPE hybrid (LLLG, w8, query temperature 32 x0.2)"
    entry = evaluate_model(with_query_temperature(model, 16), tokens, train_len=32, options=options,
                           variant="query temperature 16", trained_temperature=(32, 0.2))
    assert entry["label"] == "NoPE hybrid (LLLG, w8, query temperature 32 x0.2) + query temperature 16"
    assert entry["query_temperature"] == {"base": 16, "scale": 0.1}


def test_demo_default_output_directory_does_not_overwrite(tmp_path):
    from tapa.eval.demo import _fresh_dir

    base = tmp_path / "demo-cpu"
    assert _fresh_dir(base) == base
    base.mkdir()
    (tmp_path / "demo-cpu-2").mkdir()
    assert _fresh_dir(base) == tmp_path / "demo-cpu-3"


@pytest.mark.parametrize("flags, message", [
    (["--passkey-trials", "3"], "passkey grid reads --passkey-trials, but it runs only with --passkey"),
    (["--passkey-lengths", "256", "--seed", "1"], "reads --passkey-lengths, --seed, but"),
    (["--lengths", "64", "--multiples", "2"], "--lengths and --multiples both"),
    (["--multiples", "0,-1"], r"multiples must be positive numbers, got \[0.0, -1.0\]"),
    (["--passkey", "--passkey-depths", "1.5"], r"passkey_depths must be numbers in \[0, 1\]"),
    (["--passkey", "--passkey-trials", "0"], "passkey_trials must be an int >= 1"),
    (["--retrieval-batch-tokens", "4096"], "--retrieval-batch-tokens sizes the passkey and task batches; add"),
    (["--passkey", "--retrieval-batch-tokens", "0"], "--retrieval-batch-tokens must be at least 1, got 0"),
])
def test_eval_refuses_settings_it_would_ignore(tmp_path, flags, message):
    """Each of these used to run and silently evaluate something else: passkey settings without
    --passkey and --multiples beside --lengths did nothing, a multiple <= 0 became a 1-token length.
    They are refused before any run is read."""
    with pytest.raises(SystemExit, match=message):
        main(["eval", str(tmp_path / "not-read"), *flags, "--no-progress"])


def test_eval_query_temperature_adds_the_tempered_model(tiny_runs, tmp_path):
    """The run as trained, then the same weights with the global layers' query temperature at base
    32: equal at 16 tokens (every position below the base), different at 64."""
    out = tmp_path / "qt"
    assert main(["eval", str(tiny_runs["tapa"]), "--lengths", "16,64", "--stride", "16", "--max-tokens", "64",
                 "--eval-query-temperature", "32", "--out", str(out), "--no-progress", "--device", "cpu"]) == 0
    methods = json.loads((out / "results.json").read_text())["methods"]
    assert [m["label"] for m in methods] == ["TAPA", "TAPA + query temperature 32"]
    assert [m["query_temperature"] for m in methods] == [None, {"base": 32, "scale": 0.1}]
    assert [m["variant"] for m in methods] == [None, "query temperature 32"]
    plain, tempered = ([r["perplexity"] for r in m["perplexity"]] for m in methods)
    assert plain[0] == tempered[0] and plain[1] != tempered[1]
    assert "| TAPA + query temperature 32 |" in (out / "results.md").read_text()
    assert main(["eval", str(tiny_runs["tapa"]), "--lengths", "64", "--stride", "32", "--max-tokens", "64",
                 "--eval-query-temperature", "32", "--eval-query-temperature-scale", "0.5", "--out",
                 str(tmp_path / "qt5"), "--no-progress", "--device", "cpu"]) == 0
    methods = json.loads((tmp_path / "qt5" / "results.json").read_text())["methods"]
    assert methods[1]["label"] == "TAPA + query temperature 32 x0.5"
    for flags, message in ((["--eval-query-temperature-scale", "0.2"], "is the slope of --eval-query-temperature"),
                           (["--eval-query-temperature", "0"], "query_temperature must be an int >= 1"),
                           (["--eval-query-temperature", "8", "--eval-query-temperature-scale", "-1"],
                            "query_temperature_scale must be a finite number > 0")):
        with pytest.raises(SystemExit, match=message):
            main(["eval", str(tmp_path / "not-read"), *flags, "--no-progress"])


def test_eval_pe_needs_a_rope_run(tiny_runs, tmp_path):
    with pytest.raises(SystemExit, match="--eval-pe rope-yarn applies to RoPE-family models .* are tapa"):
        main(["eval", str(tiny_runs["tapa"]), "--eval-pe", "rope-yarn", "--lengths", "32",
              "--out", str(tmp_path / "out"), "--no-progress", "--device", "cpu"])
