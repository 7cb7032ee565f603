"""Models built on the meta device: allocated where they run, initialised by their own init."""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

__all__ = ["materialize", "on_meta"]


def on_meta(module: nn.Module) -> bool:
    """Whether any parameter or buffer of ``module`` is on the meta device (not allocated)."""
    return any(t.is_meta for t in [*module.parameters(), *module.buffers()])


def materialize(
    root: nn.Module,
    device: torch.device,
    seed: int,
    part: nn.Module | None = None,
    skip: Iterable[nn.Module] = (),
) -> None:
    """Allocate the meta tensors of ``part`` (default: all of ``root``) on ``device`` and
    initialise its modules, leaves first, with their own init: a module's
    ``reset_parameters()``, then the nearest ``_init_weights(module)`` above it
    (HuggingFace's scheme, which wins where both set a value).

    Each module is seeded by ``seed`` and its name in ``root``: a strategy that shards
    block by block (materialise a block, then shard it) gets the weights one process gets,
    on any number of ranks. Tied parameters stay tied; modules inside ``skip`` (blocks
    already done) are left alone.
    """
    part = root if part is None else part
    skipped = {id(m) for block in skip for m in block.modules()}
    names = {id(m): name for name, m in root.named_modules(remove_duplicate=False)}
    owners = _init_owners(root)
    slots: dict[int, list[tuple[dict[str, Any], str]]] = {}
    for m in root.modules():
        for table in (m._parameters, m._buffers):
            for key, tensor in table.items():
                if tensor is not None and tensor.is_meta:
                    slots.setdefault(id(tensor), []).append((table, key))
    chosen = [m for m in _leaves_first(part, set()) if id(m) not in skipped]
    own = {id(m): [*m.parameters(recurse=False), *m.buffers(recurse=False)] for m in chosen}
    had_meta = {key for key, tensors in own.items() if any(t.is_meta for t in tensors)}
    for m in chosen:  # every slot of a tensor at once: ties hold across modules
        for table in (m._parameters, m._buffers):
            for tensor in [t for t in table.values() if t is not None and t.is_meta]:
                empty = torch.empty_like(tensor, device=device)
                if isinstance(tensor, nn.Parameter):
                    empty = nn.Parameter(empty, requires_grad=tensor.requires_grad)
                for where, key in slots.pop(id(tensor), []):
                    where[key] = empty
    cuda = [device.index or 0] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda), torch.no_grad():
        for m in chosen:
            name = names.get(id(m), "")
            inits = [getattr(m, "reset_parameters", None), owners.get(id(m))]
            if not any(inits):
                if id(m) in had_meta:
                    raise TypeError(
                        f"cannot initialise {name or 'the model'} ({type(m).__name__}) built on "
                        "the meta device: give it reset_parameters(), or the model an "
                        "_init_weights(module)"
                    )
                continue
            torch.manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % 2**63)
            for init in inits:  # torch's own first (buffers too), then the model's scheme
                if init is not None:
                    init()


def _init_owners(root: nn.Module) -> dict[int, Callable[[], Any]]:
    # Each module's init from its nearest ancestor (or itself) with _init_weights(module).
    owners: dict[int, Callable[[], Any]] = {}

    def visit(module: nn.Module, owner: Any) -> None:
        owner = module if callable(getattr(module, "_init_weights", None)) else owner
        if owner is not None:
            owners[id(module)] = lambda: owner._init_weights(module)
        for child in module.children():
            visit(child, owner)

    visit(root, None)
    return owners


def _leaves_first(module: nn.Module, seen: set[int]) -> list[nn.Module]:
    found: list[nn.Module] = []
    for child in module.children():
        if id(child) not in seen:
            found += _leaves_first(child, seen)
    seen.add(id(module))
    return [*found, module]
