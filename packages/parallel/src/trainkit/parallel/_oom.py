"""Out-of-memory checkpoints of `DDP` and `FSDP` (`ParallelStrategy.add_oom_checkpoints`).

While auto-microbatching searches for a microbatch size, a rank that runs out of memory
part-way through a forward or backward must stop the others before their next collective:
each strategy here calls the Trainer's ``checkpoint`` just before every collective it
issues inside forward and backward (``trainkit.trainer._oom`` explains the protocol).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.autograd import Variable
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.distributed.fsdp import FSDPModule
from torch.nn.parallel import DistributedDataParallel
from torch.utils._pytree import tree_flatten, tree_unflatten
from torch.utils.hooks import RemovableHandle

__all__ = ["ddp_checkpoints", "fsdp_checkpoints", "reset_ddp_after_oom", "reset_fsdp_after_oom"]

_COMM_HOOK_ATTR = "_trainkit_oom_comm_hook"


def _remover(handles: list[RemovableHandle]) -> Callable[[], None]:
    def remove() -> None:
        for handle in handles:
            handle.remove()

    return remove


# --- FSDP2 ----------------------------------------------------------------------------------


def fsdp_checkpoints(model: nn.Module, checkpoint: Callable[[], None]) -> Callable[[], None]:
    """Checkpoints around every ``fully_shard``-ed module of ``model``.

    For each such module, FSDP2 issues collectives at four points, and a checkpoint runs
    just before each:

    - its forward pre-hook (the parameters' all-gather): a forward pre-hook put in front;
    - its pre-backward hook on the outputs (the all-gather for backward, and the next
      module's prefetch): a hook on each output registered before FSDP's, so it runs first;
    - its post-backward (the gradients' reduce-scatter), from an identity autograd function
      that FSDP applies to the inputs: one more, applied inside FSDP's, runs before it;
    - for the root, the end-of-backward callback (the reduce-scatter of the root's own
      parameters, and of modules whose inputs need no gradient): a callback queued first.
    """
    handles: list[RemovableHandle] = []
    for module in model.modules():
        if not isinstance(module, FSDPModule):
            continue
        root = module is model
        handles.append(module.register_forward_pre_hook(lambda _m, _a: checkpoint(), prepend=True))
        handles.append(
            module.register_forward_pre_hook(_inputs_checkpointed(checkpoint), with_kwargs=True)
        )
        handles.append(
            module.register_forward_hook(_outputs_checkpointed(checkpoint, root), prepend=True)
        )
    return _remover(handles)


class _BeforePostBackward(torch.autograd.Function):
    # The identity on a module's inputs. Applied after FSDP wraps them in its own identity
    # (RegisterPostBackwardFunction), its backward runs first: before the reduce-scatter.

    @staticmethod
    def forward(ctx: Any, checkpoint: Callable[[], None], *inputs: torch.Tensor) -> Any:
        ctx.checkpoint = checkpoint
        return inputs

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> Any:
        ctx.checkpoint()
        return (None, *grads)


def _needs_grad(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.requires_grad


def _inputs_checkpointed(checkpoint: Callable[[], None]) -> Callable[..., Any]:
    def hook(_module: nn.Module, args: Any, kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            return None
        leaves, spec = tree_flatten((args, kwargs))
        positions = [i for i, leaf in enumerate(leaves) if _needs_grad(leaf)]
        if not positions:
            return None
        wrapped = _BeforePostBackward.apply(checkpoint, *(leaves[i] for i in positions))
        for i, tensor in zip(positions, wrapped, strict=True):
            leaves[i] = tensor
        return tree_unflatten(leaves, spec)

    return hook


def _outputs_checkpointed(checkpoint: Callable[[], None], root: bool) -> Callable[..., Any]:
    def hook(_module: nn.Module, _args: Any, output: Any) -> None:
        if not torch.is_grad_enabled():
            return
        tensors = [leaf for leaf in tree_flatten(output)[0] if _needs_grad(leaf)]
        pending = [True]

        def before_backward(grad: torch.Tensor) -> None:
            if pending[0]:  # the first of the outputs' gradients: once per backward
                pending[0] = False
                checkpoint()
                if root:
                    Variable._execution_engine.queue_callback(checkpoint)

        for tensor in tensors:
            tensor.register_hook(before_backward)

    return hook


def reset_fsdp_after_oom(model: nn.Module) -> None:
    """Forget a forward or backward that an out-of-memory error interrupted, on the root
    ``fully_shard``-ed module: every group resharded, nothing in flight, every state idle,
    and the gradients of the failed attempt dropped. Without it the next forward finds the
    interrupted iteration still running (its root pre-forward is skipped; on several ranks
    the groups then disagree on their collectives and hang), and the next backward never
    queues FSDP's end-of-backward callback (the root's gradients are not reduced).

    FSDP2's own ``reset_iter_state`` does this on torch versions that have it. Older ones
    (torch 2.11 among them) keep the same per-iteration state in the attributes reset
    here, the recovery that ``reset_iter_state`` later made public.

    Raises:
        RuntimeError: this torch's FSDP2 has neither ``reset_iter_state`` nor the state
            this function knows how to reset.
    """
    if not isinstance(model, FSDPModule):
        return
    if hasattr(model, "reset_iter_state"):
        model.reset_iter_state()
        return
    state = model._get_fsdp_state()
    context, comm = getattr(state, "_state_ctx", None), getattr(state, "_comm_ctx", None)
    if context is None or comm is None or not hasattr(state, "_fsdp_param_group"):
        raise RuntimeError(
            f"torch {torch.__version__}'s FSDP2 has no reset_iter_state, and its state is "
            "not what trainkit knows how to reset after an out-of-memory error: upgrade "
            "torch, or set device_train_microbatch_size (device_eval_microbatch_size) to a "
            "number instead of 'auto'"
        )
    from torch.distributed.fsdp._fully_shard._fsdp_common import TrainingState

    states = context.all_states or [state]  # empty before the first forward
    stream = state._device_handle.current_stream()
    # Collectives in flight: waited for, then their buffers dropped.
    for name in ("all_gather_state", "reduce_scatter_state"):
        pending = getattr(comm, name, None)
        if pending is not None and pending.event is not None:
            stream.wait_event(pending.event)
        setattr(comm, name, None)
    comm.post_forward_order.clear()
    for each in states:
        each._training_state = TrainingState.IDLE
        each._modules_to_run_forward.clear()
        group = each._fsdp_param_group
        if group is None:
            continue
        group.finalize_backward()  # waits for its reductions and gathers, drops them
        if (event := group._reshard_after_forward_event) is not None:
            stream.wait_event(event)
            group._reshard_after_forward_event = None
        group._partial_reduce_output = None
        for param in group.fsdp_params:
            param.sharded_param.grad = None
            param.unsharded_accumulated_grad = None
            unsharded = getattr(param, "_unsharded_param", None)
            if unsharded is not None:
                unsharded.grad = None
        group._training_state = TrainingState.IDLE
        group._to_sharded()
    context.iter_forward_root = None
    context.post_backward_final_callback_queued = False


# --- DDP ------------------------------------------------------------------------------------


class _CommHook:
    """The state of `_all_reduce_bucket`: DDP's process group, and while armed the
    checkpoint. DDP takes one communication hook for its lifetime, so the hook stays
    registered once it is and only its checkpoint comes and goes."""

    def __init__(self, process_group: Any) -> None:
        self.process_group = process_group
        self.checkpoint: Callable[[], None] | None = None


# DDP checks the annotations of a hook's ``bucket`` and return against the real classes,
# which string annotations (``from __future__ import annotations``) never equal: none here.
def _all_reduce_bucket(state: _CommHook, bucket):
    # DDP's own all-reduce of a gradient bucket (the mean over ranks), after the checkpoint.
    if state.checkpoint is not None:
        state.checkpoint()
    return allreduce_hook(state.process_group, bucket)


def ddp_checkpoints(
    model: DistributedDataParallel, checkpoint: Callable[[], None], forced: Any
) -> Callable[[], None]:
    """Checkpoints before DDP's collectives: each gradient bucket's all-reduce (a
    communication hook), the one all-reduce of ``DDP(sync="forced")`` (``forced``, its
    `_ForcedSync`), and the buffers' broadcast at the start of forward when DDP makes one.
    """
    handles: list[RemovableHandle] = []
    if model.will_sync_module_buffers():
        handles.append(model.register_forward_pre_hook(lambda _m, _a: checkpoint(), prepend=True))
    if forced is not None:
        forced.checkpoint = checkpoint
    else:
        hook = getattr(model, _COMM_HOOK_ATTR, None)
        if hook is None:
            hook = _CommHook(model.process_group)
            if model._comm_hooks:  # DDP takes one hook: the user's stays, unchecked
                warnings.warn(
                    "DDP already has a communication hook, so auto-microbatching cannot check "
                    "before each gradient all-reduce whether another rank ran out of memory: "
                    "an out-of-memory error on only some ranks during backward may hang the "
                    "run. Set device_train_microbatch_size to a number to avoid it",
                    stacklevel=2,
                )
            else:
                model.register_comm_hook(hook, _all_reduce_bucket)
            setattr(model, _COMM_HOOK_ATTR, hook)
        hook.checkpoint = checkpoint

    def remove() -> None:
        _remover(handles)()
        if forced is not None:
            forced.checkpoint = None
        else:
            getattr(model, _COMM_HOOK_ATTR).checkpoint = None

    return remove


def reset_ddp_after_oom(model: nn.Module) -> None:
    """Forget a backward that an out-of-memory error interrupted: DDP's reducer otherwise
    refuses the next forward ("Expected to have finished reduction in the prior
    iteration"). ``_reset_state`` is what DDP itself calls to start over."""
    if isinstance(model, DistributedDataParallel):
        model.reducer._reset_state()
