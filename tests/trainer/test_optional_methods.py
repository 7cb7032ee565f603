"""A model's optional methods: its own (on its class, or set on the instance), else the
default (``eval_forward``: ``forward``; ``loss_weight``: samples)."""

import torch
from torch import nn

from trainkit.core import DataSpec, TrainModel
from trainkit.trainer.loop import eval_forward, microbatch_weights


class Plain(nn.Module):
    def forward(self, batch):
        return ("forward", batch)


class Own(Plain):
    def eval_forward(self, batch, outputs=None):
        return ("eval_forward", batch)


def test_a_model_without_eval_forward_is_called():
    assert eval_forward(Plain(), 1) == ("forward", 1)


def test_a_models_eval_forward_is_used_from_its_class_or_its_instance():
    assert eval_forward(Own(), 2) == ("eval_forward", 2)
    model = Plain()
    model.eval_forward = lambda batch: ("set on the instance", batch)
    assert eval_forward(model, 3) == ("set on the instance", 3)


def test_microbatches_weigh_by_loss_weight_where_the_model_defines_it():
    batches = [(torch.zeros(3, 1), torch.tensor([1, -100, 1])), (torch.zeros(1, 1), torch.ones(1))]
    data = DataSpec(batches)
    assert TrainModel.loss_weight is None  # declared: found on the class, no lookup miss
    assert microbatch_weights(Plain(), data, batches) == [0.75, 0.25]  # by samples
    assert microbatch_weights(TrainModel(), data, batches) == [0.75, 0.25]
    model = Plain()
    model.loss_weight = lambda batch: int((batch[1] != -100).sum())  # label tokens
    assert microbatch_weights(model, data, batches) == [2 / 3, 1 / 3]
