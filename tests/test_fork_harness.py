"""The fork harness stays usable after a test compiles (AOTAutograd) in the test process."""

import torch
from torch import nn

from multirank import autograd_threads_started, run_ranks


def _backward(rank: int, world_size: int = 1) -> torch.Tensor:
    torch.manual_seed(rank)
    layer = nn.Linear(3, 2)
    layer(torch.randn(4, 3)).sum().backward()
    return layer.weight.grad


def test_ranks_run_backward_after_the_test_process_compiled_and_backpropagated():
    # AOTAutograd tracing, then a backward through it, in the test process. Before
    # tests/conftest.py's first backward, a worker whose first backward was this one started
    # autograd's device threads, and every forked rank's backward failed from then on.
    layer = nn.Linear(4, 4)
    torch.compile(layer, backend="aot_eager")(torch.randn(2, 4)).sum().backward()
    assert layer.weight.grad is not None
    assert not autograd_threads_started()
    grads = run_ranks(_backward, 2)
    for rank, grad in enumerate(grads):
        torch.testing.assert_close(grad, _backward(rank), rtol=0, atol=0)
