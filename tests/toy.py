"""Small models and data shared by the core tests."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from trainkit.core import TrainModel
from trainkit.trainer import Classifier


def blobs(n: int = 128, features: int = 8, seed: int = 0) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=generator)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).long()
    return TensorDataset(x, y)


def mlp(features: int = 8, hidden: int = 16, dropout: float = 0.1, seed: int = 0) -> Classifier:
    torch.manual_seed(seed)
    net = nn.Sequential(
        nn.Linear(features, hidden), nn.ReLU(), nn.Dropout(dropout), nn.Linear(hidden, 2)
    )
    return Classifier(net, num_classes=2)


def loader(dataset: Dataset, batch_size: int = 16, shuffle: bool = True) -> DataLoader:
    return DataLoader(dataset, batch_size=batch_size, shuffle=shuffle)


class CountingDataset(Dataset):
    """Records which indices were loaded."""

    def __init__(self, base: TensorDataset):
        self.base = base
        self.loaded: list[int] = []

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, index: int):
        self.loaded.append(index)
        return self.base[index]


class OOMAbove(TrainModel):
    """A classifier that raises torch.OutOfMemoryError for microbatches larger than ``limit``."""

    def __init__(self, limit: int, seed: int = 0):
        super().__init__()
        self.limit = limit
        self.inner = mlp(dropout=0.0, seed=seed)
        self.sizes: list[int] = []

    def forward(self, batch):
        self.sizes.append(batch[0].shape[0])
        if batch[0].shape[0] > self.limit:
            raise torch.OutOfMemoryError(f"fake OOM: {batch[0].shape[0]} > {self.limit}")
        return self.inner(batch)

    def loss(self, outputs, batch):
        return self.inner.loss(outputs, batch)


class EvalOOM(Classifier):
    """Records each eval forward's size; runs out of memory above ``limit`` samples, and on
    the forward calls numbered in ``fail_calls`` (1-based)."""

    def __init__(self, limit: int = 1000, fail_calls: tuple[int, ...] = ()):
        torch.manual_seed(0)
        super().__init__(
            nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)), num_classes=2
        )
        self.limit, self.fail_calls, self.sizes = limit, set(fail_calls), []

    def eval_forward(self, batch):
        self.sizes.append(batch[0].shape[0])
        if batch[0].shape[0] > self.limit or len(self.sizes) in self.fail_calls:
            raise torch.OutOfMemoryError(f"fake out of memory at {batch[0].shape[0]} samples")
        return super().eval_forward(batch)


def flat_params(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])
