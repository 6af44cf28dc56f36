"""Theory checks: Monte Carlo of the logit's mean and variance vs distance, RoPE against TAPA.

See `tapa.theory.monte_carlo` for the setting, the closed forms and the choice of parameters.
"""

from tapa.theory.monte_carlo import (
    METHODS,
    TheoryConfig,
    exact_moments,
    measured_sigma_squared,
    method_logits,
    run_monte_carlo,
    sigma_squared,
)

__all__ = ["METHODS", "TheoryConfig", "exact_moments", "measured_sigma_squared", "method_logits",
           "run_monte_carlo", "sigma_squared"]
