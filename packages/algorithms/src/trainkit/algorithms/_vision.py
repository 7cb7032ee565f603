"""Putting a transform into the training dataset (torchvision's convention), for the
image methods that can run in the loader's workers instead of on the batch."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

from trainkit.core import State

__all__ = ["add_dataset_transform", "require_torchvision"]


def require_torchvision(what: str) -> ModuleType:
    """``torchvision.transforms``, or an ImportError saying how to install it."""
    try:
        import torchvision.transforms as transforms
    except ModuleNotFoundError as err:
        raise ImportError(
            f"{what} needs torchvision, which is not installed ({err}); install it with: "
            'pip install "trainkit-algorithms[vision]"'
        ) from err
    return transforms


def add_dataset_transform(state: State, transform: Callable[[Any], Any], method: str) -> bool:
    """Insert ``transform`` into the training dataset's ``transform``, before its first
    ``ToTensor`` / ``PILToTensor`` (it works on PIL images), as Composer does.

    Returns False when the dataset already has it (a second ``fit`` on the same data).
    Raises TypeError when the training data is not a DataLoader over a dataset with a
    ``transform`` attribute (a torchvision dataset).
    """
    loader = state.train_data.dataloader if state.train_data is not None else None
    dataset = getattr(loader, "dataset", None)
    if dataset is None or not hasattr(dataset, "transform"):
        found = type(dataset).__name__ if dataset is not None else type(loader).__name__
        raise TypeError(
            f"{method} with batch=False puts its transform into the training dataset, which "
            f"must have a `transform` attribute (a torchvision dataset); got {found}. Use "
            f"batch=True, or add the method's transform to your dataset yourself"
        )
    transforms = require_torchvision(f"{method} with batch=False")
    current = dataset.transform
    to_tensor = (transforms.ToTensor, transforms.PILToTensor)
    if isinstance(current, transforms.Compose):
        if any(t is transform for t in current.transforms):
            return False
        index = next(
            (i for i, t in enumerate(current.transforms) if isinstance(t, to_tensor)),
            len(current.transforms),
        )
        current.transforms.insert(index, transform)
        return True
    if current is transform:
        return False
    if current is None:
        dataset.transform = transform
    elif isinstance(current, to_tensor):
        dataset.transform = transforms.Compose([transform, current])
    else:
        dataset.transform = transforms.Compose([current, transform])
    _refresh_joint_transform(dataset)
    return True


def _refresh_joint_transform(dataset: Any) -> None:
    """torchvision datasets also keep ``transforms``, built from ``transform`` at init."""
    try:
        from torchvision.datasets.vision import StandardTransform
    except ImportError:
        return
    if isinstance(getattr(dataset, "transforms", None), StandardTransform):
        dataset.transforms = StandardTransform(dataset.transform, dataset.target_transform)
