"""Seeding and capturing/restoring random number generator state."""

from __future__ import annotations

import os
import random
import sys
from typing import Any

import torch

__all__ = ["get_rng_state", "random_seed", "seed_everything", "set_rng_state"]


def seed_everything(seed: int) -> None:
    """Seed Python's ``random``, torch (CPU and CUDA) and numpy when installed."""
    if not 0 <= seed < 2**32:
        raise ValueError(f"seed must be in [0, 2**32), got {seed}")
    random.seed(seed)
    torch.manual_seed(seed)
    numpy = _numpy()
    if numpy is not None:
        numpy.random.seed(seed)


def random_seed() -> int:
    """A fresh seed from the OS (for a run given none; broadcast it so every rank agrees)."""
    return int.from_bytes(os.urandom(4), "little")


def _numpy() -> Any:
    # Only touch numpy if something already imported it: importing it for RNG state
    # alone would add to everyone's start-up time.
    return sys.modules.get("numpy")


def get_rng_state() -> dict[str, Any]:
    """This process's generator states, as plain Python values and CPU tensors."""
    state: dict[str, Any] = {
        "python": _python_state_to_list(random.getstate()),
        "torch": torch.get_rng_state(),
    }
    numpy = _numpy()
    if numpy is not None:
        kind, keys, pos, has_gauss, gauss = numpy.random.get_state()
        state["numpy"] = [kind, torch.from_numpy(keys.astype("int64")), pos, has_gauss, gauss]
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(_python_state_from_list(state["python"]))
    torch.set_rng_state(state["torch"])
    numpy = _numpy()
    if numpy is not None and "numpy" in state:
        kind, keys, pos, has_gauss, gauss = state["numpy"]
        numpy.random.set_state((kind, keys.numpy().astype("uint32"), pos, has_gauss, gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def _python_state_to_list(state: tuple[Any, ...]) -> list[Any]:
    version, internal, gauss = state
    return [version, list(internal), gauss]


def _python_state_from_list(state: list[Any]) -> tuple[Any, ...]:
    version, internal, gauss = state
    return (version, tuple(internal), gauss)
