"""The paper's statements about the logit's mean and variance, as measured Monte Carlo numbers.

Tolerances are multiples of the Monte Carlo standard error (SE) of each estimate. The setting and
the reason for the default parameters are in tapa.theory.monte_carlo's docstring.
"""

from __future__ import annotations

import csv
import math

import pytest
import torch

from tapa.cli import main as tapa_main
from tapa.ops.tapa.reference import tapa_logits
from tapa.theory import (
    METHODS,
    TheoryConfig,
    exact_moments,
    measured_sigma_squared,
    method_logits,
    run_monte_carlo,
    sigma_squared,
)

NEAR = (10, 18, 32, 56, 100)
FAR = (10_000, 17_783, 31_623, 56_234, 100_000)
CFG = TheoryConfig(samples=100_000)


@pytest.fixture(scope="module")
def rows():
    return run_monte_carlo(CFG, distances=NEAR + (1_000,) + FAR)


def _row(rows, method, distance):
    (row,) = [r for r in rows if r["method"] == method and r["distance"] == distance]
    return row


def _rms(values):
    return math.sqrt(sum(v * v for v in values) / len(values))


def test_monte_carlo_agrees_with_closed_forms(rows):
    # Checks the sampler, the estimators and their SEs, the closed forms, and that the logits
    # really are the ones the closed forms describe: 66 estimates, each within 4.5 SE.
    for row in rows:
        z_mean = (row["mean"] - row["exact_mean"]) / row["mean_se"]
        z_var = (row["var"] - row["exact_var"]) / row["var_se"]
        assert abs(z_mean) < 4.5 and abs(z_var) < 4.5, row


@pytest.mark.parametrize("method", ["tapa", "tapa-linear-phase"])
def test_tapa_bias_decays_with_distance(rows, method):
    near, mid, far = (_row(rows, method, d) for d in (10, 1_000, 100_000))

    def separation(a, b):  # how many SEs |E| at a exceeds |E| at b
        return (abs(a["mean"]) - abs(b["mean"])) / math.hypot(a["mean_se"], b["mean_se"])

    assert separation(near, far) > 30
    assert separation(near, mid) > 10
    assert abs(far["mean"]) < 4 * far["mean_se"]  # at 1e5 no bias is measurable at all
    # the same over the whole long-range window, relative to near range
    near_rms = _rms([_row(rows, method, d)["mean"] for d in NEAR])
    far_rms = _rms([_row(rows, method, d)["mean"] for d in FAR])
    assert far_rms < 0.05 * near_rms


def test_rope_bias_does_not_decay(rows):
    # RoPE's E[logit] is a sum of undamped oscillations in the distance: over the long-range
    # window its size is comparable to near range and many SEs away from zero.
    near_rms = _rms([_row(rows, "rope", d)["mean"] for d in NEAR])
    far = [_row(rows, "rope", d) for d in FAR]
    far_rms = _rms([r["mean"] for r in far])
    far_se = max(r["mean_se"] for r in far)
    assert far_rms > 0.5 * near_rms
    assert far_rms > 30 * far_se
    assert sum(abs(r["mean"]) > 10 * r["mean_se"] for r in far) >= 4


@pytest.mark.parametrize("method", ["tapa", "tapa-linear-phase"])
def test_tapa_variance_stays_at_half_sigma_squared(rows, method):
    half_sigma2 = sigma_squared(CFG) / 2
    for distance in FAR:
        row = _row(rows, method, distance)
        assert row["var"] > half_sigma2 - 4 * row["var_se"], row
        assert abs(row["var"] - half_sigma2) < 4 * row["var_se"], row  # the limit itself
    # and never far below it at near range either (the bias term E[A]^2 C^2 is small here)
    for distance in NEAR:
        assert _row(rows, method, distance)["var"] > 0.9 * half_sigma2


def test_sigma_squared_is_the_amplitude_second_moment():
    cfg = TheoryConfig(samples=200_000)
    measured, se = measured_sigma_squared(cfg)
    assert abs(measured - sigma_squared(cfg)) < 4.5 * se
    # at distance 0 the phase factor is cos(0) = 1: mean E[A], variance sigma^2 - E[A]^2
    amp_mean = math.sqrt(cfg.dims[0]) * cfg.amp_mean_q * cfg.amp_mean_k
    for method in ("tapa", "tapa-linear-phase"):
        mean, var = exact_moments(method, 0, cfg)
        assert mean == pytest.approx(amp_mean)
        assert var == pytest.approx(sigma_squared(cfg) - amp_mean**2)


def test_logits_are_the_library_definitions():
    cfg = TheoryConfig()
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 5, cfg.head_dim, generator=gen, dtype=torch.float64)
    for method, phase in (("tapa", "quadratic"), ("tapa-linear-phase", "linear")):
        full = tapa_logits(q, k, torch.arange(7, 12), torch.zeros(5, dtype=torch.long),
                           amp_dim=cfg.dims[0], alpha=cfg.alpha, distance="power", phase=phase)
        for i in range(5):
            got = method_logits(method, q[i:i + 1], k[i:i + 1], 7 + i, cfg)
            torch.testing.assert_close(got[0], full[i, i])
    # RoPE: relative position only, and (R_m q).(R_0 k) at m = 0 is the plain dot product
    plain = (q * k).sum(-1) / math.sqrt(cfg.head_dim)
    torch.testing.assert_close(method_logits("rope", q, k, 0, cfg), plain, rtol=1e-6, atol=1e-6)
    rotated = method_logits("rope", q, k, 300, cfg)
    assert (rotated - plain).abs().max() > 1e-2


def test_bad_configuration_raises():
    for kwargs, name in ((dict(head_dim=7), "head_dim"), (dict(theta=0.01), "theta"),
                         (dict(alpha=0.0), "alpha"), (dict(samples=10), "samples"),
                         (dict(phase_std=0.0), "phase_std")):
        with pytest.raises(ValueError, match=name):
            TheoryConfig(**kwargs)
    with pytest.raises(ValueError, match="distances"):
        run_monte_carlo(TheoryConfig(samples=100), distances=[0, 10])


def test_command_writes_csv_plot_and_readme(tmp_path, capsys):
    out = tmp_path / "theory"
    assert tapa_main(["theory", "--out", str(out), "--samples", "2000",
                      "--points-per-decade", "1", "--no-progress"]) == 0
    with open(out / "theory.csv", newline="") as handle:
        table = list(csv.DictReader(handle))
    assert {r["method"] for r in table} == set(METHODS)
    assert sorted({int(r["distance"]) for r in table}) == [1, 10, 100, 1_000, 10_000, 100_000]
    assert (out / "theory.png").stat().st_size > 10_000
    readme = (out / "README.md").read_text()
    assert "Command:" in readme and "Hardware:" in readme and r"\|E\| at 100,000" in readme
    printed = capsys.readouterr().out
    assert "tapa-linear-phase" in printed and str(out / "theory.csv") in printed
