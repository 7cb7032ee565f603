"""Targets as class probabilities, for the methods that mix or smooth them.

MixUp and CutMix (with ``interpolate_loss=False``) and LabelSmoothing replace a batch's
targets by a distribution over classes at BEFORE_LOSS, as Composer's
``ensure_targets_one_hot`` does: class indices become one-hot vectors along dim 1 of the
model's outputs; targets already shaped like the outputs are taken as probabilities.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["class_probabilities", "mix_probabilities"]


def class_probabilities(
    logits: torch.Tensor, target: torch.Tensor, method: str, hint: str = ""
) -> torch.Tensor:
    """``target`` as probabilities shaped like ``logits`` (classes along dim 1).

    Class indices are shaped like ``logits`` without dim 1; probabilities like ``logits``.
    The result is float32 (float64 for float64 logits), whatever the autocast dtype.

    Raises:
        ValueError: naming ``method`` (and ending with ``hint``), when ``logits`` are not
            class scores or ``target`` is neither.
    """
    if not isinstance(logits, torch.Tensor) or logits.ndim < 2:
        raise ValueError(
            f"{method} turns the targets into class probabilities, which needs the model's "
            "outputs to be class scores shaped (N, classes, ...); got "
            f"{type(logits).__name__} {tuple(getattr(logits, 'shape', ()))}{hint}"
        )
    dtype = torch.promote_types(logits.dtype, torch.float32)
    if target.shape == logits.shape and target.is_floating_point():
        return target.to(dtype)
    index_shape = logits.shape[:1] + logits.shape[2:]
    if not target.is_floating_point() and not target.is_complex() and target.shape == index_shape:
        return F.one_hot(target.long(), logits.shape[1]).movedim(-1, 1).to(dtype)
    raise ValueError(
        f"{method} needs class indices shaped {tuple(index_shape)} or probabilities shaped "
        f"{tuple(logits.shape)} (the model's outputs); got {target.dtype} targets shaped "
        f"{tuple(target.shape)}{hint}"
    )


def mix_probabilities(
    logits: torch.Tensor,
    target: torch.Tensor,
    permuted_target: torch.Tensor,
    mixing: float,
    method: str,
) -> torch.Tensor:
    """``(1 - mixing) * p(target) + mixing * p(permuted_target)``, as probabilities."""
    hint = "; set interpolate_loss=True to mix the losses instead"
    own = class_probabilities(logits, target, method, hint)
    other = class_probabilities(logits, permuted_target, method, hint)
    return torch.lerp(own, other, mixing)
