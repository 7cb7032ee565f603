"""Context parallel with ring attention on NCCL (run with `uv run pytest -m gpu`).

torch's ring attention runs the CUDA kernels of scaled_dot_product_attention only, so this
is where context parallel's attention is checked (test_context_parallel.py checks the rest
on CPU). A Llama model trains with its sequences split over ``min(2, GPUs)`` ranks, one GPU
each, started with ``spawn`` (CUDA forbids fork) and joined through a store this process
hosts on a port the OS picks; its losses and weights are compared with the same training in
this process on one GPU without context parallel. On a machine with one GPU the degree is 1:
the same hooks, DTensor dispatch and CUDA attention kernels, on a ring of one.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from parallel.context_parallel_gpu_ranks import LENGTH, SAMPLES, context_parallel_rank, fit
from parallel.helpers import full_weights, max_difference

pytestmark = pytest.mark.gpu


def test_llama_with_context_parallel_trains_like_one_gpu(tmp_path):
    import torch.multiprocessing as mp

    world = min(2, torch.cuda.device_count())
    store = dist.TCPStore("127.0.0.1", 0, world, is_master=True, wait_for_workers=False)
    mp.start_processes(
        context_parallel_rank,
        args=(world, store.port, str(tmp_path)),
        nprocs=world,
        start_method="spawn",
    )
    split = torch.load(tmp_path / "context_parallel.pt", weights_only=True)
    reference, losses = fit(None)
    weights = full_weights(reference.state.model)
    torch.testing.assert_close(split["losses"], losses, rtol=1e-4, atol=1e-4)
    assert max_difference(split["weights"], weights) < 1e-4
    assert losses[-1] < losses[0]
    # Each sample and token counted once, though `world` ranks computed parts of each.
    assert split["counted"] == (SAMPLES, SAMPLES * LENGTH)
