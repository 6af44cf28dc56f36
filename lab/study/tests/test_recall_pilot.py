"""The associative-recall pilot (lab/study/recall_pilot.py): its sequences, and a run end to end."""

import json

import pytest
import torch

from lab.study import recall_pilot as rp


def test_each_target_is_the_value_after_the_keys_earlier_occurrence():
    gen = torch.Generator().manual_seed(0)
    inputs, targets, offsets = rp.make_batch(16, 96, 6, gen)
    assert inputs.shape == targets.shape == (16, 96)
    for row in range(16):
        seq, offset = inputs[row].tolist(), int(offsets[row])
        pairs = {seq[offset + 2 * i]: seq[offset + 2 * i + 1] for i in range(6)}
        assert all(rp.KEY0 <= k < rp.VALUE0 <= v < rp.FILLER0 for k, v in pairs.items())
        asked = (targets[row] >= 0).nonzero().flatten().tolist()
        assert len(asked) == 6 and asked[-1] == 95  # the last query's answer is the next token
        for slot in asked:
            assert targets[row, slot].item() == pairs[seq[slot]]  # the key's own value
        # a key appears twice (its pair, its query); everything else is filler
        assert sum(rp.KEY0 <= t < rp.VALUE0 for t in seq) == 12
        assert offset + 12 <= asked[0]  # the pairs come before the queries
    with pytest.raises(ValueError, match="holds no"):
        rp.make_batch(1, 20, 6, gen)


def test_a_tiny_run_writes_its_result_and_table(tmp_path, capsys):
    rp.main(["--arms", "hybrid-tapa", "hybrid-nope", "--seeds", "0", "--steps", "3", "--dim", "32",
             "--heads", "2", "--eval-lens", "64", "256", "--eval-seqs", "8", "--out", str(tmp_path),
             "--no-progress"])
    for arm in ("hybrid-tapa", "hybrid-nope"):
        result = json.loads((tmp_path / f"{arm}-s0.json").read_text())
        assert [e["length"] for e in result["evals"]] == [64, 256]
        assert all(e["queries"] == 8 * rp.Setup().pairs for e in result["evals"])
    capsys.readouterr()
    rp.main(["--table", str(tmp_path), "--plot", str(tmp_path / "recall.png")])
    table = capsys.readouterr().out
    assert (tmp_path / "recall.png").stat().st_size > 10_000
    assert "| TAPA globals (theta 0.5) | 0 |" in table and "| NoPE globals | 0 |" in table


def test_the_frozen_phase_arm_keeps_its_phase_rows_at_zero(tmp_path, monkeypatch):
    from tapa.model import is_phase_parameter
    setup = rp.Setup(dim=32, heads=2, steps=2, eval_lens=(64,), eval_seqs=4)
    captured, original = {}, rp.accuracy

    def spy(model, length, setup_, seed):  # the trained model, before its evaluation
        captured.update({n: p.detach().clone() for n, p in model.named_parameters() if is_phase_parameter(n)})
        return original(model, length, setup_, seed)

    monkeypatch.setattr(rp, "accuracy", spy)
    rp.run_arm("hybrid-tapa-nophase", 0, setup, tmp_path, progress=False)
    assert captured and all(p.abs().max() == 0 for p in captured.values())
    rp.run_arm("hybrid-tapa", 0, setup, tmp_path, progress=False)
    assert all(p.abs().max() > 0 for p in captured.values())  # the spy sees what it should


def test_spread_test_tells_a_wide_arm_from_a_steady_one(tmp_path):
    """A wide arm against a steady one gives the smallest p the split count allows (2 of C(8, 4)
    splits are as extreme); two equally spread arms give 1; the table adds the seed-spread rows
    once both arms have 4 seeds."""
    wide, steady = [0.0, 10.0, 20.0, 30.0], [14.0, 15.0, 16.0, 15.0]
    dev_wide, dev_steady, p = rp.spread_test(wide, steady)
    assert (dev_wide, dev_steady) == (10.0, 0.5) and p == pytest.approx(2 / 70)
    assert rp.spread_test([1.0, 2.0, 3.0, 4.0], [11.0, 12.0, 13.0, 14.0])[2] == 1.0
    with pytest.raises(ValueError, match="2\\+ values"):
        rp.spread_test([1.0], [1.0, 2.0])
    results = {arm: [{"seed": seed, "evals": [{"accuracy": value / 100}]} for seed, value in enumerate(values)]
               for arm, values in (("hybrid-tapa", wide), ("hybrid-nope", steady))}
    lines = "\n".join(rp.spread_lines(results))
    assert f"| {rp.LABELS['hybrid-tapa']} | 4 against 4 | 0 / 10 / 20 / 30 | 10.0 | 0.5 | 0.029 |" in lines
    results["hybrid-nope"] = results["hybrid-nope"][:3]
    assert rp.spread_lines(results) == []  # 3 NoPE seeds: no spread rows


def test_the_window_table_and_plot_set_windows_side_by_side(tmp_path, capsys):
    tiny = ["--steps", "2", "--dim", "32", "--heads", "2", "--eval-lens", "64", "128",
            "--eval-seqs", "4", "--no-progress"]
    for window, seeds in ((8, ["0", "1"]), (32, ["0"])):
        rp.main(["--arms", "hybrid-tapa", "hybrid-nope", "--seeds", *seeds, "--window", str(window),
                 "--out", str(tmp_path / f"w{window}"), *tiny])
    capsys.readouterr()
    folders = [str(tmp_path / "w8"), str(tmp_path / "w32")]
    rp.main(["--windows", *folders, "--plot", str(tmp_path / "windows.png")])
    table = capsys.readouterr().out.strip().splitlines()
    assert table[0].startswith("| arm | window | seeds | loss on the answers | 64 (1x) | 128 (2x) |")
    rows = [line.split(" | ")[:3] for line in table[2:]]
    assert rows == [["| TAPA globals (theta 0.5)", "8", "0, 1"], ["| TAPA globals (theta 0.5)", "32", "0"],
                    ["| NoPE globals", "8", "0, 1"], ["| NoPE globals", "32", "0"]]
    # each cell is the mean of its seeds' accuracies
    runs = [json.loads((tmp_path / "w8" / f"hybrid-nope-s{s}.json").read_text()) for s in (0, 1)]
    mean = sum(100 * r["evals"][1]["accuracy"] for r in runs) / 2
    assert table[4].split(" | ")[5].startswith(f"{mean:.1f} (")
    assert (tmp_path / "windows.png").stat().st_size > 10_000
    rp.main(["--windows", *folders, "--seeds", "1"])  # a seed filter keeps seed 1 only
    assert [line.split(" | ")[1:3] for line in capsys.readouterr().out.strip().splitlines()[2:]] == \
        [["8", "1"], ["8", "1"]]
    with pytest.raises(SystemExit, match="more than one"):  # the same run twice is refused
        rp.window_table([folders[0], folders[0]])


def test_each_lever_arm_sets_its_lever_and_nothing_else():
    setup = rp.Setup(dim=32, heads=2)
    base = {"tapa": rp.model_config("hybrid-tapa", setup), "nope": rp.model_config("hybrid-nope", setup)}
    expected = {"hybrid-tapa-theta25": {"theta": 0.25}, "hybrid-tapa-theta75": {"theta": 0.75},
                "hybrid-tapa-alpha05": {"alpha": 0.05}, "hybrid-tapa-alpha2": {"alpha": 0.2},
                "hybrid-tapa-temp": {"query_temperature_base": setup.train_len},
                "hybrid-nope-temp": {"query_temperature_base": setup.train_len}}
    for arm, lever in expected.items():
        cfg = rp.model_config(arm, setup)
        ref = base[cfg.pe]
        changed = {f: getattr(cfg, f) for f in vars(cfg) if getattr(cfg, f) != getattr(ref, f)}
        assert changed == lever, arm


def test_the_ratio_arms_share_a_depth_and_differ_in_their_global_layers():
    setup = rp.Setup(dim=32, heads=2)
    for kind in ("tapa", "nope"):
        llg, l5g = (rp.model_config(f"hybrid-{kind}-{tag}", setup) for tag in ("llg", "l5g"))
        kinds = {tag: [cfg.layer_kind(i) for i in range(cfg.n_layers)] for tag, cfg in (("llg", llg), ("l5g", l5g))}
        assert llg.n_layers == l5g.n_layers == 6 and llg.pe == l5g.pe == kind
        assert kinds["llg"].count("global") == 2 and kinds["l5g"].count("global") == 1
        assert kinds["llg"][-1] == kinds["l5g"][-1] == "global"
        assert rp.lever_reference(f"hybrid-{kind}-l5g") == f"hybrid-{kind}-llg"
    # the frozen-phase diagnosis at LLG differs from TAPA's LLG arm by the phase rows alone, and is
    # read against it
    llg, frozen = rp.model_config("hybrid-tapa-llg", setup), rp.model_config("hybrid-tapa-nophase-llg", setup)
    changed = {f for f in vars(frozen) if getattr(frozen, f) != getattr(llg, f)}
    assert changed == {"phase_init_scale"} and frozen.phase_init_scale == 0.0
    assert rp.lever_reference("hybrid-tapa-nophase-llg") == "hybrid-tapa-llg"
    assert rp.lever_reference("hybrid-tapa-nophase") == "hybrid-tapa"


def _fake_run(folder, arm, seed, accuracies, window=16):
    """A result JSON as run_arm writes it, with the given accuracy (in %) at lengths 64 and 128."""
    folder.mkdir(parents=True, exist_ok=True)
    setup = {"train_len": 64, "window": window, "eval_lens": [64, 128]}
    evals = [{"length": n, "accuracy": a / 100} for n, a in zip((64, 128), accuracies)]
    (folder / f"{arm}-s{seed}.json").write_text(json.dumps({"arm": arm, "seed": seed, "setup": setup,
                                                            "final_loss": 3.0, "evals": evals}))


def test_the_lever_tables_read_each_lever_against_its_reference_seed_by_seed(tmp_path, capsys):
    base, levers = tmp_path / "base", tmp_path / "levers"
    for seed, (tapa, nope) in enumerate([(10, 20), (30, 22), (20, 18)]):
        _fake_run(base, "hybrid-tapa", seed, [tapa, tapa])
        _fake_run(base, "hybrid-nope", seed, [nope, nope])
        _fake_run(levers, "hybrid-tapa-temp", seed, [tapa + 5, tapa + 1])    # +3 on every seed
        _fake_run(levers, "hybrid-nope-temp", seed, [nope - 2, nope - 2])    # -2 on every seed
        _fake_run(levers, "hybrid-nope-llg", seed, [nope, nope])
        _fake_run(levers, "hybrid-nope-l5g", seed, [nope + 4 * (seed - 1)] * 2)  # -4 / 0 / +4
    _fake_run(levers, "hybrid-tapa-alpha2", 0, [50, 50], window=32)  # another window: left out
    rp.main(["--levers", str(base), str(levers), "--plot", str(tmp_path / "levers.png")])
    lines = capsys.readouterr().out.splitlines()
    rows = {line.split(" | ")[0][2:]: line.split(" | ")[1:] for line in lines if line.startswith("| ")}
    assert rows["TAPA globals, query temperature"] == [
        "0, 1, 2", "13.0 / 33.0 / 23.0", "23.0", "21.0", "TAPA globals (theta 0.5)", "+3.0 / +3.0 / +3.0",
        "3 of 3 |"]
    assert rows["NoPE globals, query temperature"][5:] == ["-2.0 / -2.0 / -2.0", "0 of 3 |"]
    assert rows["NoPE globals, LLLLLG ratio"][4:] == [rp.LABELS["hybrid-nope-llg"], "-4.0 / +0.0 / +4.0",
                                                     "1 of 3 |"]
    llg = next(line for line in lines if line.startswith("| NoPE globals, LLG ratio"))
    assert llg.endswith("| 20.0 | 20.0 | | | |")  # a reference itself: three empty cells
    assert "TAPA globals, alpha 0.2" not in rows
    # TAPA against NoPE: the base (means 20 and 20) and the temperature (23 against 18): one-sided
    # exact Mann-Whitney p that TAPA recalls more; NoPE's ratio arms have no TAPA twin
    assert rows["base (LLLG)"] == ["20.0 (3)", "20.0 (3)", "+0.0", "0.60 |"]  # U = 4.5: 12 of 20 splits
    assert rows["temp"] == ["23.0 (3)", "18.0 (3)", "+5.0", "0.35 |"]  # U = 6: 7 of 20
    assert "llg" not in rows and "l5g" not in rows
    assert (tmp_path / "levers.png").stat().st_size > 10_000
