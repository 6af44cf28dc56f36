"""Monte Carlo of the attention logit's mean and variance versus distance: RoPE against TAPA.

Setting. q and k are independent Gaussian vectors of size D, the same distribution at every
position (the paper's iid assumption), with a nonzero mean. The first d_A dims (TAPA's amplitude
part) have mean a_q (for q), a_k (for k) and std s_A; the last d_P dims (the phase part) have mean
m_q, m_k and std s_P. For a query at position lambda and a key at 0 the logits are

    RoPE:  (R_lambda q) . (R_0 k) / sqrt(D)          (tapa.positional; pairs (i, i + D/2))
    TAPA:  A * cos(2 pi f(lambda) phi)                (tapa.ops.tapa.reference.tapa_logits)
           A = q_A . k_A / sqrt(d_A),  f(lambda) = lambda ** alpha,
           phi = q_P . k_P / sqrt(d_P) (quadratic) or (sum q_P + sum k_P) / sqrt(d_P) (linear).

What the paper states, and what is measured here:
- RoPE. E[logit] = (1/sqrt D) sum_i (mu0_i cos(lambda w_i) + nu0_i sin(lambda w_i)), with
  mu0_i = E[q_i k_i + q_j k_j], nu0_i = E[q_i k_j - q_j k_i] (j = i + D/2) and w_i the rotary
  frequencies: a sum of undamped oscillations, so the distance bias never decays. Here pair i
  joins an amplitude dim and a phase dim, so mu0 = a_q a_k + m_q m_k and
  nu0 = +-(a_q m_k - m_q a_k): both nonzero with the defaults.
- TAPA. A and phi use disjoint dims, so they are independent and, writing C(w) = E[cos(w phi)],
      E[logit]   = E[A] C(2 pi f)                                            -> 0
      Var[logit] = E[A^2] (1 + C(4 pi f)) / 2 - E[A]^2 C(2 pi f)^2          -> sigma^2 / 2
  with sigma^2 := E[A^2] = s_A^2 (a_q^2 + a_k^2) + s_A^4 + d_A a_q^2 a_k^2, the second moment of
  the amplitude score (for zero-mean q, k: the variance of a plain dot-product logit). C decays
  because phi has a density (Riemann-Lebesgue); the paper's rate is |lambda|^(-alpha d_P).
  The variance tends to sigma^2/2 because cos^2 averages to 1/2: the content signal survives at
  every distance while the bias goes away.
- Closed forms for C, used as the "exact" columns and checked against the Monte Carlo:
  linear phase: phi ~ N(sqrt(d_P)(m_q + m_k), 2 s_P^2), so C(w) = cos(w mu) exp(-w^2 s_P^2);
  quadratic phase: given q_P, phi is Gaussian; averaging over q_P (a Gaussian integral per dim)
      C(w) = Re[ g^(d_P) ],  g = (1 + 2 c s_P^2)^(-1/2) exp((i b m_q - b^2 s_P^2 / 2 - c m_q^2)
                                                             / (1 + 2 c s_P^2)),
      b = w m_k / sqrt(d_P), c = w^2 s_P^2 / (2 d_P).

Why these defaults (TheoryConfig). With alpha = 0.1, f(lambda) only grows from 1 to 3.16 over
distances 1..1e5. If phi had an O(1) spread (unit-variance components) C(2 pi f) would be below
1e-3 already at distance 1: true to the theorem but the decay would happen before the plotted
range and no Monte Carlo could resolve it. A phase-part std s_P = 0.15 puts the decay inside the
range (the model's analogue is `phase_init_scale`, which shrinks the phase rows of W_q, W_k). The
quadratic phase's spread is ~s_P sqrt(m_q^2 + s_P^2), the linear one's sqrt(2) s_P; m_q = 1.4,
m_k = 0 makes them about equal (~0.21) and keeps the quadratic phi centered, so its C is
monotone, while the linear phi is centered at sqrt(d_P) * 1.4 and its mean oscillates under a
decaying envelope. a_q = a_k = 0.5 with s_A = 1 gives E[A] = 0.71 and sigma^2 = 2.0. D = 16
(d_A = d_P = 8, theta = 0.5) gives RoPE eight frequencies (base 1e4). With 1e6 samples per
distance the standard error of a mean is ~1e-3, against |E| ~ 0.2-0.7 near range.

Every distance draws fresh samples (so estimates at different distances are independent); the
three methods share the samples at a distance. Standard errors: sqrt(var / n) for the mean and
sqrt((m4 - var^2) / n) for the variance (m4 the fourth central moment).
"""

from __future__ import annotations

import cmath
import contextlib
import math
from dataclasses import asdict, dataclass

import numpy as np
import torch

from tapa.ops.tapa.reference import split_dims, tapa_logits
from tapa.positional.rope import apply_rope, rope_cos_sin, rope_inv_freq
from tapa.positional.kinds import get_kind

METHODS = ("rope", "tapa", "tapa-linear-phase")


@dataclass
class TheoryConfig:
    head_dim: int = 16
    theta: float = 0.5
    alpha: float = 0.1
    rope_base: float = 10000.0
    amp_mean_q: float = 0.5
    amp_mean_k: float = 0.5
    amp_std: float = 1.0
    phase_mean_q: float = 1.4
    phase_mean_k: float = 0.0
    phase_std: float = 0.15
    samples: int = 1_000_000  # per distance
    max_distance: int = 100_000
    points_per_decade: int = 6
    seed: int = 0
    chunk: int = 1 << 18  # samples drawn at once (bounds memory)

    def __post_init__(self):
        if self.head_dim < 4 or self.head_dim % 2:
            raise ValueError(f"head_dim must be even and >= 4, got {self.head_dim}")
        amp_dim, phase_dim = split_dims(self.head_dim, self.theta)
        if amp_dim == 0 or phase_dim == 0:
            raise ValueError(f"theta={self.theta} leaves an empty part of head_dim={self.head_dim}")
        if self.alpha <= 0:
            raise ValueError(f"alpha must be > 0, got {self.alpha}")
        if self.amp_std <= 0 or self.phase_std <= 0:
            raise ValueError("amp_std and phase_std must be > 0")
        if self.samples < 100:
            raise ValueError(f"samples must be >= 100, got {self.samples}")
        if self.max_distance < 1 or self.points_per_decade < 1:
            raise ValueError("max_distance and points_per_decade must be >= 1")

    @property
    def dims(self) -> tuple[int, int]:
        return split_dims(self.head_dim, self.theta)

    def distances(self) -> np.ndarray:
        """Log-spaced integer distances 1..max_distance (every power of ten included)."""
        decades = math.log10(self.max_distance)
        count = int(round(decades * self.points_per_decade)) + 1
        return np.unique(np.round(np.logspace(0, decades, count)).astype(np.int64))

    def means_and_stds(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per-dim mean of q, mean of k, and std (shared), float64."""
        amp_dim, phase_dim = self.dims
        mean_q = torch.tensor([self.amp_mean_q] * amp_dim + [self.phase_mean_q] * phase_dim)
        mean_k = torch.tensor([self.amp_mean_k] * amp_dim + [self.phase_mean_k] * phase_dim)
        std = torch.tensor([self.amp_std] * amp_dim + [self.phase_std] * phase_dim)
        return mean_q.double(), mean_k.double(), std.double()

    def to_dict(self) -> dict:
        return asdict(self)


def sigma_squared(cfg: TheoryConfig) -> float:
    """sigma^2 = E[A^2], the second moment of the amplitude score (see the module docstring)."""
    amp_dim, _ = cfg.dims
    a_q, a_k, s = cfg.amp_mean_q, cfg.amp_mean_k, cfg.amp_std
    return s**2 * (a_q**2 + a_k**2) + s**4 + amp_dim * a_q**2 * a_k**2


def _rope_rotation(cfg: TheoryConfig, position: int) -> torch.Tensor:
    """The matrix R with R @ x = apply_rope(x) at `position` (float64)."""
    inv_freq = rope_inv_freq(cfg.head_dim, cfg.rope_base)
    cos, sin = rope_cos_sin(inv_freq, torch.tensor([position]))
    basis = torch.eye(cfg.head_dim, dtype=torch.float64)[:, None, None, :]  # rows e_j
    return apply_rope(basis, cos, sin)[:, 0, 0, :].T  # column j = R e_j


def method_logits(method: str, q: torch.Tensor, k: torch.Tensor, distance: int,
                  cfg: TheoryConfig) -> torch.Tensor:
    """Logits (n,) of n query/key pairs (q, k: (n, D)), the query at `distance`, the key at 0."""
    if method == "rope":
        # (R_m q) . (R_0 k) = q^T (R_m^T R_0) k: one small matrix instead of rotating every sample
        bilinear = (_rope_rotation(cfg, distance).T @ _rope_rotation(cfg, 0)).to(q.dtype)
        return ((q @ bilinear) * k).sum(-1) / math.sqrt(cfg.head_dim)
    amp_dim, _ = cfg.dims
    logits = tapa_logits(q[:, None, :], k[:, None, :], torch.tensor([distance]), torch.tensor([0]),
                         amp_dim=amp_dim, alpha=cfg.alpha, distance="power",
                         phase=get_kind(method).phase)
    return logits.reshape(-1)


def _sample_pairs(cfg: TheoryConfig, gen: torch.Generator, count: int):
    """`count` independent (q, k) pairs, each (count, D) float32, drawn in the configured law."""
    mean_q, mean_k, std = (t.float() for t in cfg.means_and_stds())
    noise = torch.randn(2, count, cfg.head_dim, generator=gen)
    return mean_q + std * noise[0], mean_k + std * noise[1]


class _Moments:
    """Streaming mean, variance and their standard errors (sums of powers about a shift)."""

    def __init__(self):
        self.count = 0
        self.shift = None
        self.power_sums = np.zeros(4)

    def add(self, values: torch.Tensor):
        x = values.double()
        if self.shift is None:
            self.shift = float(x.mean())
        x = x - self.shift
        x2 = x * x
        self.count += x.numel()
        self.power_sums += [float(x.sum()), float(x2.sum()), float((x2 * x).sum()),
                            float((x2 * x2).sum())]

    def result(self) -> dict:
        n = self.count
        r1, r2, r3, r4 = self.power_sums / n  # raw moments about the shift
        var = r2 - r1**2
        m4 = r4 - 4 * r1 * r3 + 6 * r1**2 * r2 - 3 * r1**4
        unbiased = var * n / (n - 1)
        return {"mean": self.shift + r1, "mean_se": math.sqrt(unbiased / n), "var": unbiased,
                "var_se": math.sqrt(max(m4 - var**2, 0.0) / n)}


def _phase_char(cfg: TheoryConfig, phase: str, omega: float) -> float:
    """C(omega) = E[cos(omega * phi)], in closed form (module docstring)."""
    _, phase_dim = cfg.dims
    m_q, m_k, s = cfg.phase_mean_q, cfg.phase_mean_k, cfg.phase_std
    if phase == "linear":
        center = math.sqrt(phase_dim) * (m_q + m_k)
        return math.cos(omega * center) * math.exp(-(omega**2) * s**2)
    b = omega * m_k / math.sqrt(phase_dim)
    c = omega**2 * s**2 / (2 * phase_dim)
    denom = 1 + 2 * c * s**2
    log_g = complex(-c * m_q**2 - b**2 * s**2 / 2, b * m_q) / denom - 0.5 * math.log(denom)
    return cmath.exp(phase_dim * log_g).real


def exact_moments(method: str, distance: int, cfg: TheoryConfig) -> tuple[float, float]:
    """(E[logit], Var[logit]) in closed form, for the query at `distance` and the key at 0."""
    mean_q, mean_k, std = cfg.means_and_stds()
    if method == "rope":
        rot_q, rot_k = _rope_rotation(cfg, distance), _rope_rotation(cfg, 0)
        mu_x, mu_y = rot_q @ mean_q, rot_k @ mean_k
        cov_x = rot_q @ torch.diag(std**2) @ rot_q.T
        cov_y = rot_k @ torch.diag(std**2) @ rot_k.T
        # x ~ N(mu_x, cov_x), y ~ N(mu_y, cov_y) independent:
        # Var(x.y) = tr(cov_x cov_y) + mu_y' cov_x mu_y + mu_x' cov_y mu_x
        var = torch.trace(cov_x @ cov_y) + mu_y @ cov_x @ mu_y + mu_x @ cov_y @ mu_x
        return float(mu_x @ mu_y) / math.sqrt(cfg.head_dim), float(var) / cfg.head_dim
    amp_dim, _ = cfg.dims
    amp_mean = math.sqrt(amp_dim) * cfg.amp_mean_q * cfg.amp_mean_k
    omega = 2 * math.pi * distance**cfg.alpha
    char = _phase_char(cfg, get_kind(method).phase, omega)
    char_double = _phase_char(cfg, get_kind(method).phase, 2 * omega)
    return amp_mean * char, sigma_squared(cfg) * (1 + char_double) / 2 - amp_mean**2 * char**2


@contextlib.contextmanager
def _single_thread():
    """Run torch on one intra-op thread: the per-chunk tensors are small and memory-bound, so a
    second thread saves little, and on a shared CPU its synchronization made the run 3x slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def run_monte_carlo(cfg: TheoryConfig, distances=None, progress: bool = False) -> list[dict]:
    """One row per (distance, method): distance, method, mean, mean_se, var, var_se,
    exact_mean, exact_var. distances default to cfg.distances()."""
    with _single_thread():
        return _run_monte_carlo(cfg, distances, progress)


def _run_monte_carlo(cfg, distances, progress):
    gen = torch.Generator().manual_seed(cfg.seed)
    distances = [int(d) for d in (cfg.distances() if distances is None else distances)]
    if not distances or min(distances) < 1:
        raise ValueError(f"distances must be positive integers, got {distances}")
    iterator = distances
    if progress:
        from tapa._optional import available
        if available("tqdm"):
            from tqdm import tqdm
            iterator = tqdm(distances, desc="theory: distances", unit="dist")
    rows = []
    for distance in iterator:
        moments = {method: _Moments() for method in METHODS}
        for start in range(0, cfg.samples, cfg.chunk):
            q, k = _sample_pairs(cfg, gen, min(cfg.chunk, cfg.samples - start))
            for method in METHODS:
                moments[method].add(method_logits(method, q, k, distance, cfg))
        for method in METHODS:
            exact_mean, exact_var = exact_moments(method, distance, cfg)
            rows.append({"distance": distance, "method": method, **moments[method].result(),
                         "exact_mean": exact_mean, "exact_var": exact_var})
    return rows


def measured_sigma_squared(cfg: TheoryConfig) -> tuple[float, float]:
    """Monte Carlo E[A^2] (TAPA's logit at distance 0 is A) and its standard error."""
    gen = torch.Generator().manual_seed(cfg.seed + 1)
    moments = _Moments()
    with _single_thread():
        for start in range(0, cfg.samples, cfg.chunk):
            q, k = _sample_pairs(cfg, gen, min(cfg.chunk, cfg.samples - start))
            moments.add(method_logits("tapa", q, k, 0, cfg) ** 2)
    result = moments.result()
    return result["mean"], result["mean_se"]
