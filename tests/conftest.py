"""Shared test set-up.

Multi-rank tests fork ranks from this process (see tests/multirank.py): the heavy torch
modules are imported here, once, before any fork, so each rank starts in ~0.1 s.
"""

import torch
import torch._dynamo
import torch.distributed.checkpoint
import torch.distributed.fsdp
import torch.distributed.tensor.parallel  # noqa: F401
