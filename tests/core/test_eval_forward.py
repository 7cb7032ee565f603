"""``eval_forward``: the model's own (on its class, or set on the instance), else ``forward``."""

from torch import nn

from trainkit.core.loop import eval_forward


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
