"""trainkit.algorithms: training methods, each registered under ``trainkit.algorithms``."""

from trainkit.algorithms._passes import (
    STANDARD_PASSES,
    order_by_role,
    warn_on_combined_loss_interpolation,
)
from trainkit.algorithms._surgery import (
    Policy,
    check_surgery_allowed,
    rebind_after_surgery,
    replace_modules,
)
from trainkit.algorithms.ema import EMA, EMAConfig, compute_ema
from trainkit.algorithms.gradient_clipping import (
    GradientClipping,
    GradientClippingConfig,
    apply_gradient_clipping,
)

__all__ = [
    "EMA",
    "STANDARD_PASSES",
    "EMAConfig",
    "GradientClipping",
    "GradientClippingConfig",
    "Policy",
    "apply_gradient_clipping",
    "check_surgery_allowed",
    "compute_ema",
    "order_by_role",
    "rebind_after_surgery",
    "replace_modules",
    "warn_on_combined_loss_interpolation",
]
