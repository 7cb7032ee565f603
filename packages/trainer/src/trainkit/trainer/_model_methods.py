"""Calling a model's optional methods (``loss_weight``, ``eval_forward``) cheaply, per batch."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn


def optional_method(model: nn.Module, name: str) -> Callable[..., Any] | None:
    """``model.<name>`` where the model defines it (on its class, or set on the instance),
    else None. Asked per batch: a plain ``getattr(model, name, None)`` on a module without
    it goes through ``nn.Module.__getattr__``, which raises and catches an AttributeError
    (~790 ns against ~210 here, measured on 2 CPU cores)."""
    if getattr(type(model), name, None) is None and name not in vars(model):
        return None
    return getattr(model, name)
