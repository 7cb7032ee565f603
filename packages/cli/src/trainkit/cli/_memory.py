"""``trainkit plan``: the device memory a run needs per rank, before launch.

The model is built on the meta device (nothing allocated) and one microbatch of the run's
own data goes through its forward there, counting what autograd saves for the backward.
To that come the parameters, gradients and optimizer state each rank holds under the
run's strategy (sharded by FSDP over its shard and tensor degrees, replicated by DDP),
what FSDP gathers for compute, and autocast's copies of the weights. Then the same for the
choices that would make it fit: FSDP over every rank, activation checkpointing, a smaller
microbatch, CPU offload.

What is estimated, not traced: bf16 activations under ``amp_bf16``/``amp_fp16`` (the trace
runs in fp32 on the meta device; floating tensors count half), tensor parallelism's split
of the activations (not divided), and the CUDA context and allocator slack, kept apart as
``--reserve``.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import math
import re
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import CheckpointPolicy

from trainkit.core import plugins, repeated_blocks
from trainkit.core.data import to_device

__all__ = ["Estimate", "Layout", "activation_bytes", "add_parser", "estimate", "parse_bytes"]

GiB = 2**30
# Optimizer state per parameter, in copies of it, by class name (fp32 each).
_STATES = {"Adam": 2, "AdamW": 2, "DecoupledAdamW": 2, "NAdam": 2, "RAdam": 2, "Adamax": 2,
           "Lion": 1, "Adagrad": 1, "RMSprop": 1, "Muon": 1}  # fmt: skip


@dataclass(frozen=True)
class Layout:
    """How a run places its model: the ranks, what shards over them, and its options."""

    world_size: int
    shard: int = 1
    """Ranks that share one copy of the parameters, gradients and optimizer state (FSDP)."""
    tensor: int = 1
    """Tensor-parallel degree: each layer split over this many ranks."""
    fsdp: bool = False
    cpu_offload: bool = False
    checkpointing: str | None = None
    """Activation checkpointing applied: "full", "selective", "offload" or None."""
    microbatch: int = 1
    mixed: bool = False
    """Autocast to bf16/fp16 (``amp_*`` precision)."""


@dataclass
class Estimate:
    """Device bytes per rank, by part; ``notes`` say what was assumed."""

    layout: Layout
    parts: dict[str, int]
    notes: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(self.parts.values())


def parse_bytes(text: str) -> int:
    """``"80GB"``, ``"80GiB"``, ``"141 GB"``, ``"512MB"`` -> bytes (GB read as GiB, as
    ``nvidia-smi`` rounds)."""
    match = re.fullmatch(r"\s*([\d.]+)\s*([KMGT]?)i?B?\s*", text, flags=re.I)
    if not match:
        raise ValueError(f"{text!r} is not a memory size; use e.g. 80GB, 141GB, 24GiB, 512MB")
    scale = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}[match.group(2).upper()]
    return int(float(match.group(1)) * scale)


def activation_bytes(
    model: nn.Module, batch: Any, mixed: bool, keeps: Callable[[Any], bool] | None = None
) -> int:
    """Bytes autograd keeps from one forward of ``batch`` (on the meta device) until the
    backward, the parameters it saves excepted; floating tensors count half when mixed.

    Attention runs as a fused kernel does on a GPU (the meta device would otherwise take
    the math path and keep the whole attention matrix). ``keeps``: an operator policy of
    selective checkpointing (`selective_policy`), whose kept outputs bypass autograd's
    hooks, so they are counted from the operators themselves."""
    kept: dict[int, int] = {}

    def size(tensor: torch.Tensor) -> int:
        whole = tensor.numel() * tensor.element_size()
        return whole // 2 if mixed and tensor.is_floating_point() else whole

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        base = tensor._base if tensor._base is not None else tensor
        if not (base.is_leaf and base.requires_grad):  # a parameter (or a view of one)
            kept[id(tensor)] = size(tensor)
        return tensor

    inside = [0]  # selective checkpointing keeps outputs inside the checkpointed blocks only
    handles = [
        handle
        for block in (repeated_blocks(model) if keeps is not None else [])
        for handle in (
            block.register_forward_pre_hook(lambda *_: inside.__setitem__(0, inside[0] + 1)),
            block.register_forward_hook(lambda *_: inside.__setitem__(0, inside[0] - 1)),
        )
    ]

    class Kept(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            out = func(*args, **(kwargs or {}))
            if keeps is not None and inside[0] and keeps(func):
                first = out[0] if isinstance(out, tuple | list) else out
                if isinstance(first, torch.Tensor):
                    kept[id(first)] = size(first)
            return out

    plain = torch.nn.functional.scaled_dot_product_attention
    torch.nn.functional.scaled_dot_product_attention = _fused_attention(plain)
    try:
        with (
            torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor),
            Kept(),
            warnings.catch_warnings(),
        ):
            # Selective checkpointing's own saves bypass the hooks, which Kept counts.
            warnings.filterwarnings("ignore", "A saved_tensors_hooks context", FutureWarning)
            outputs = model(batch)
            loss = model.loss(outputs, batch)
    finally:
        torch.nn.functional.scaled_dot_product_attention = plain
        for handle in handles:
            handle.remove()
    del outputs, loss
    return sum(kept.values())


def _fused_attention(plain: Callable[..., Any]) -> Callable[..., Any]:
    # What a fused attention kernel keeps for backward: its inputs, output and row
    # log-sum-exps, never the (sequence x sequence) matrix.
    def attention(query: Any, key: Any, value: Any, attn_mask: Any = None, dropout_p: float = 0.0,
                  is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False) -> Any:  # fmt: skip
        if key.shape[-3] != query.shape[-3]:  # grouped keys and values: one per query head
            repeat = query.shape[-3] // key.shape[-3]
            key, value = key.repeat_interleave(repeat, -3), value.repeat_interleave(repeat, -3)
        try:
            return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                query, key, value, dropout_p, is_causal, attn_mask=attn_mask, scale=scale
            )[0]
        except (RuntimeError, NotImplementedError):
            return plain(query, key, value, attn_mask, dropout_p, is_causal, scale=scale)

    return attention


def estimate(
    model: nn.Module,
    optimizers: Sequence[Any],
    layout: Layout,
    activations: int,
) -> Estimate:
    """Per-rank device bytes of ``model`` (on the meta device) trained as ``layout`` says,
    with ``activations`` the bytes one microbatch's forward keeps."""
    notes: list[str] = []
    numels = [p.numel() for p in model.parameters()]
    total = sum(numels)
    bytes_each = next((p.element_size() for p in model.parameters()), 4)
    split = layout.shard * layout.tensor if layout.fsdp else layout.tensor
    params = total * bytes_each // split
    states = 0
    for optimizer in optimizers or [None]:
        name = type(optimizer).__name__ if optimizer is not None else "AdamW"
        if name == "SGD" or name == "DecoupledSGDW":
            states = max(states, 1 if optimizer.defaults.get("momentum", 0) else 0)
        elif name in _STATES:
            states = max(states, _STATES[name])
        else:
            states = max(states, 2)
            notes.append(f"optimizer {name}: counted as AdamW's two states per parameter")
    parts = {
        "parameters": params,
        "gradients": params,
        "optimizer state": states * 4 * total // split,
    }
    if layout.cpu_offload:
        notes.append("cpu_offload: parameters, gradients and optimizer state in CPU memory")
        parts = dict.fromkeys(parts, 0)
    if not layout.fsdp and layout.world_size // layout.tensor > 1:
        parts["DDP gradient buckets"] = params  # DDP's flat copy of the gradients
    compute = 2 if layout.mixed else bytes_each
    blocks = repeated_blocks(model)
    if layout.fsdp:
        largest = max((sum(p.numel() for p in b.parameters()) for b in blocks), default=total)
        outside = total - sum(sum(p.numel() for p in b.parameters()) for b in blocks)
        # The block running and the one prefetched, the root kept gathered, and one block's
        # unsharded gradients before their reduce-scatter.
        parts["gathered for compute"] = (
            2 * largest + outside
        ) * compute // layout.tensor + largest * 4 // layout.tensor
    elif layout.mixed:
        parts["autocast weight copies"] = total * 2 // layout.tensor
    parts["activations"] = activations
    if layout.tensor > 1:
        notes.append("tensor parallel: activations counted whole (not divided)")
    if layout.mixed:
        notes.append("activations traced in fp32 on the meta device, floating ones counted half")
    return Estimate(layout, parts, notes)


# --- the command ------------------------------------------------------------------------------


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "plan",
        help="the memory per GPU a run needs, and what would make it fit, before launch",
        description="Estimate the device memory per rank of CONFIG's run on NODES x "
        "GPUS_PER_NODE ranks: parameters, gradients, optimizer state, what FSDP gathers, "
        "activations of one microbatch (traced on the meta device: nothing is allocated). "
        "Then the same for the choices that would make it fit.",
    )
    parser.add_argument("config", type=Path, help="a YAML config (as for trainkit train)")
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--gpus-per-node", type=int, default=1)
    parser.add_argument("--gpu-memory", default="80GB", help="each GPU's memory (80GB)")
    parser.add_argument(
        "--reserve", default="2GB", help="kept for the CUDA context and allocator slack (2GB)"
    )
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from trainkit.cli._build import build_run
    from trainkit.cli._config import load_config

    for name in ("nodes", "gpus_per_node"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
    world = args.nodes * args.gpus_per_node
    memory, reserve = parse_bytes(args.gpu_memory), parse_bytes(args.reserve)
    if reserve >= memory:
        raise ValueError(
            f"--reserve {args.reserve} leaves nothing of --gpu-memory {args.gpu_memory}"
        )
    config = load_config(args.config, args.set)
    built = build_run(config, meta_model=True).config
    model, batch = built.model, next(iter(built.train_dataloader))
    layout, described = _layout(built, world, batch)
    microbatch = _microbatch(built, batch)
    usable = memory - reserve
    plans = _plans(model, built, layout, batch, microbatch)
    now = plans[0][1]
    count = sum(p.numel() for p in model.parameters())
    print(
        f"{type(model).__name__}: {count / 1e6:,.1f}M parameters; {described} on {args.nodes} "
        f"node(s) x {args.gpus_per_node} GPU(s) = {world} rank(s); microbatch {microbatch}"
    )
    print(f"per rank, GiB (of {memory / GiB:.1f}, {usable / GiB:.1f} usable after --reserve):")
    for part, size in now.parts.items():
        print(f"  {part:28s} {size / GiB:9.2f}")
    verdict = "fits" if now.total <= usable else "does not fit"
    print(f"  {'total':28s} {now.total / GiB:9.2f}  {verdict}")
    for note in now.notes:
        print(f"  note: {note}")
    others = [(what, e) for what, e in plans[1:] if e.total <= usable]
    if others:
        print("fits with:" if now.total > usable else "other choices:")
        for what, e in others:
            print(f"  {what:58s} {e.total / GiB:9.2f} GiB")
    elif now.total > usable:
        print("none of FSDP over every rank, activation checkpointing, a smaller microbatch")
        print("or CPU offload makes it fit: more GPUs, or tensor parallelism, are needed")
    return 0 if now.total <= usable else 1


def _layout(built: Any, world: int, batch: Any) -> tuple[Layout, str]:
    strategy = built.parallelism
    mixed = str(getattr(built.precision, "name", built.precision) or "fp32").startswith("amp")
    algorithms = [a for a in built.algorithms if type(a).__name__ == "ActivationCheckpointing"]
    checkpointing = algorithms[0].config.mode if algorithms else None
    base = Layout(world_size=world, mixed=mixed, checkpointing=checkpointing)
    if strategy is None or not hasattr(strategy, "dims"):
        name = (
            type(strategy).__name__
            if strategy is not None
            else ("DDP" if world > 1 else "one process")
        )
        return base, name
    dims = strategy.dims(world)
    fsdp = type(strategy).__name__ == "FSDP"
    sharding = getattr(strategy.config, "sharding", "") if fsdp else ""
    layout = replace(
        base,
        shard=dims.shard if sharding != "none" else 1,
        tensor=dims.tensor,
        fsdp=fsdp,
        cpu_offload=bool(getattr(strategy.config, "cpu_offload", False)),
    )
    return layout, f"{type(strategy).__name__}({sharding or f'tensor {dims.tensor}'})"


def _microbatch(built: Any, batch: Any) -> int:
    from trainkit.core import DataSpec

    whole = DataSpec.coerce(built.train_dataloader, "train_dataloader").get_num_samples_in_batch(
        batch
    )
    size = built.device_train_microbatch_size
    return size if isinstance(size, int) else whole


def _plans(
    model: nn.Module, built: Any, layout: Layout, batch: Any, microbatch: int
) -> list[tuple[str, Estimate]]:
    """The run as configured, then the choices that change its memory."""
    from trainkit.core import DataSpec

    data = DataSpec.coerce(built.train_dataloader, "train_dataloader")
    whole = data.get_num_samples_in_batch(batch)
    first = data.split_batch(batch, microbatch)[0] if microbatch < whole else batch
    meta = to_device(first, torch.device("meta"))
    layout = replace(layout, microbatch=microbatch)
    acts = activation_bytes(model, meta, layout.mixed)
    given = built.optimizers
    optimizers = list(given) if isinstance(given, list | tuple) else [given] if given else []
    plans = [("as configured", estimate(model, optimizers, layout, acts))]
    if not layout.fsdp or layout.shard * layout.tensor < layout.world_size:
        every = replace(layout, fsdp=True, shard=layout.world_size // layout.tensor)
        plans.append(("FSDP over every rank", estimate(model, optimizers, every, acts)))
    else:
        every = layout
    if layout.checkpointing is None and "activation_checkpointing" in plugins.available(
        "trainkit.algorithms"
    ):
        algorithm = plugins.load("trainkit.algorithms", "activation_checkpointing")
        functions = importlib.import_module(algorithm.__module__)
        policy = functions.selective_policy
        for mode in ("selective", "full"):
            checkpointed = copy.deepcopy(model)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "matched no module": no estimate then
                if not functions.apply_activation_checkpointing(checkpointed, mode):
                    break
            keeps = (
                (lambda op: policy(None, op) == CheckpointPolicy.MUST_SAVE)
                if mode == "selective"
                else None
            )
            saved = activation_bytes(checkpointed, meta, layout.mixed, keeps)
            plans.append(
                (f"FSDP over every rank + {mode} activation checkpointing",
                 estimate(model, optimizers, replace(every, checkpointing=mode), saved))
            )  # fmt: skip
    size = microbatch
    while size > 1:
        size = math.ceil(size / 2)
        smaller = acts * size // microbatch
        plans.append(
            (f"FSDP over every rank, microbatch {size}",
             estimate(model, optimizers, replace(every, microbatch=size), smaller))
        )  # fmt: skip
    plans.append(
        ("FSDP over every rank + cpu_offload",
         estimate(model, optimizers, replace(every, cpu_offload=True), acts))
    )  # fmt: skip
    return plans
