"""``Trainer(compile=...)``: torch.compile in place, same results and checkpoints as eager."""

import copy

import pytest
import torch
from torch import nn

from toy import blobs, flat_params, loader, mlp
from trainkit.core import (
    Algorithm,
    Callback,
    Engine,
    Event,
    Logger,
    LoggerDestination,
    SingleProcess,
    State,
)
from trainkit.trainer import Trainer, TrainerConfig
from trainkit.trainer.loop import prepare_run

AOT = {"backend": "aot_eager"}  # Dynamo and AOTAutograd without a C++ compiler: fast to build


def make_trainer(compile=False, model=None, data=None, **kwargs):
    kwargs.setdefault("max_duration", "4ba")
    model = model or mlp(dropout=0.0)
    return Trainer(
        model=model,
        train_dataloader=data or loader(blobs(64), shuffle=False),
        optimizers=torch.optim.SGD(model.parameters(), lr=0.1),
        device="cpu",
        seed=0,
        progress_bar=False,
        compile=compile,
        **kwargs,
    )


class Losses(Callback):
    def __init__(self) -> None:
        self.losses: list[float] = []

    def batch_end(self, state, logger) -> None:
        self.losses.append(float(state.total_loss))


class Metrics(LoggerDestination):
    def __init__(self) -> None:
        self.logged: list[tuple[int, dict]] = []

    def log_metrics(self, metrics, step) -> None:
        self.logged.append((step, dict(metrics)))

    def values(self, name: str) -> list[tuple[int, float]]:
        return [(step, float(m[name])) for step, m in self.logged if name in m]


def _train(compile) -> tuple[list[float], torch.Tensor, Trainer]:
    losses = Losses()
    trainer = make_trainer(compile, callbacks=[losses])
    trainer.fit()
    return losses.losses, flat_params(trainer.state.model), trainer


def test_inductor_trains_to_the_same_loss_as_eager():
    eager_losses, eager_weights, _ = _train(False)
    losses, weights, trainer = _train(True)  # the default backend: inductor (C++ on CPU)
    model = trainer.state.model
    assert model._compiled_call_impl is not None  # compiled in place
    assert losses == pytest.approx(eager_losses, rel=1e-4, abs=1e-5)
    torch.testing.assert_close(weights, eager_weights, rtol=1e-4, atol=1e-5)
    assert not torch.equal(weights, flat_params(mlp(dropout=0.0)))  # it did train


def test_compile_options_reach_torch_compile_and_eval_and_predict_use_it():
    graphs: list[bool] = []

    def recording_backend(graph_module, example_inputs):
        graphs.append(torch.is_grad_enabled())
        return graph_module.forward

    data = loader(blobs(32), shuffle=False)
    trainer = make_trainer(
        {"backend": recording_backend, "dynamic": False}, eval_dataloader=data, max_duration="2ba"
    )
    trainer.fit()
    assert graphs[0] is True  # the training forward
    after_fit = len(graphs)
    assert after_fit >= 2  # the final evaluation ran compiled (eval mode, no grad: a new graph)
    eager = make_trainer(False, eval_dataloader=data, max_duration="2ba")
    eager.fit()
    compiled_eval = trainer.eval()
    for name, value in eager.eval().items():
        torch.testing.assert_close(compiled_eval[name], value)
    outputs = trainer.predict(data)
    torch.testing.assert_close(torch.cat(outputs), torch.cat(eager.predict(data)))
    assert not any(graphs[after_fit:])  # predict: compiled graphs only, no new training ones
    assert trainer.state.model._compiled_call_impl is not None


def test_checkpoints_of_compiled_and_eager_runs_are_interchangeable():
    whole = make_trainer(False, max_duration="6ba")
    whole.fit()
    compiled = make_trainer(AOT, max_duration="6ba")
    compiled.fit(duration="3ba")
    saved = copy.deepcopy(compiled.state.state_dict())
    eager_keys = make_trainer(False).state.model.state_dict().keys()
    assert compiled.state.model.state_dict().keys() == eager_keys  # no "_orig_mod." prefix
    resumed = make_trainer(False, max_duration="6ba")  # eager, from the compiled checkpoint
    resumed.state.load_state_dict(saved)
    resumed.fit()
    torch.testing.assert_close(
        flat_params(resumed.state.model), flat_params(whole.state.model), rtol=1e-5, atol=1e-6
    )
    back = make_trainer(AOT, max_duration="6ba")  # and compiled again, from the eager one
    back.state.load_state_dict(copy.deepcopy(resumed.state.state_dict()))
    assert back.state.timestamp.batch == 6
    torch.testing.assert_close(flat_params(back.state.model), flat_params(whole.state.model))


def test_a_batch_size_change_recompiles_and_the_count_is_logged():
    torch._dynamo.reset()  # forget shapes other tests compiled (automatic dynamic is per code)
    metrics = Metrics()
    # 40 samples in batches of 16: the third batch of each epoch has 8 samples.
    trainer = make_trainer(
        AOT, data=loader(blobs(40), shuffle=False), max_duration="2ep", loggers=[metrics]
    )
    trainer.fit()
    recompiles = metrics.values("compile/recompiles")
    assert recompiles, "the new batch size was not logged as a recompile"
    step, count = recompiles[0]
    assert step == 3 and count >= 1  # logged at the batch that had the new shape
    assert [c for _, c in recompiles] == sorted(c for _, c in recompiles)
    assert trainer.state.loop_private.recompiles is not None
    assert trainer.state.loop_private.recompiles.recompiles == recompiles[-1][1]
    # Automatic dynamic shapes: after the first recompile the size is symbolic, so the
    # second epoch's batches (16, 16, 8) compile nothing new.
    assert recompiles[-1][1] == count


def test_no_recompile_metric_when_shapes_stay_the_same():
    torch._dynamo.reset()
    metrics = Metrics()
    make_trainer(AOT, loggers=[metrics]).fit()
    assert metrics.values("compile/recompiles") == []


class WrapActivation(Algorithm):
    """Surgery at INIT: replaces a module (as surgery algorithms do)."""

    def match(self, event, state):
        return event == Event.INIT

    def apply(self, event, state, logger):
        net = state.model.module
        net[1] = nn.Sequential(net[1], nn.Identity())


class RecordingStrategy(SingleProcess):
    def __init__(self, calls: list) -> None:
        super().__init__()
        self.calls = calls

    def prepare(self, state) -> None:
        self.calls.append(("prepare", isinstance(state.model.module[1], nn.Sequential)))

    def compile(self, model, options) -> None:
        self.calls.append(("compile", dict(options)))
        super().compile(model, options)


def test_compile_runs_after_surgery_and_the_strategy_through_its_hook():
    calls: list = []
    model = mlp(dropout=0.0)
    trainer = Trainer(
        model=model,
        train_dataloader=loader(blobs(32)),
        max_duration="1ba",
        optimizers=torch.optim.SGD(model.parameters(), lr=0.1),
        device="cpu",
        progress_bar=False,
        algorithms=[WrapActivation()],
        parallelism=RecordingStrategy(calls),
        compile=AOT,
    )
    assert calls == [("prepare", True), ("compile", AOT)]
    assert trainer.state.model._compiled_call_impl is not None
    trainer.fit()


def test_a_hand_written_loop_compiles_through_prepare_run():
    model = mlp(dropout=0.0)
    state = State(model=model, optimizers=[torch.optim.SGD(model.parameters(), lr=0.1)])
    prepare_run(state, Engine(state, Logger([], state)), compile=AOT)
    assert model._compiled_call_impl is not None and state.loop_private.recompiles is not None
    assert make_trainer(False).state.model._compiled_call_impl is None  # off by default


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ({"mod": "max-autotune"}, r"'mod' is not a torch.compile keyword argument; accepted: "),
        ("yes", r"compile must be True, False or a dict of torch.compile keyword arguments"),
        (1, r"got 1"),
    ],
)
def test_bad_compile_options_name_what_is_accepted(setting, message):
    with pytest.raises(ValueError, match=message) as info:
        make_trainer(setting)
    if isinstance(setting, dict):
        assert "mode" in str(info.value) and "dynamic" in str(info.value)


def test_bad_compile_options_fail_before_anything_is_built():
    with pytest.raises(ValueError, match=r"'backnd' is not a torch.compile keyword"):
        TrainerConfig(model=mlp(), compile={"backnd": "eager"})
