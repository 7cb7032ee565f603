"""Training on a CUDA device: auto-microbatching on a real out-of-memory error (training and
evaluation), compile, and the peak-memory target (run with `uv run pytest -m gpu`; skipped without a GPU).

amp_bf16 and amp_fp16 with its scaler are in tests/trainer/test_gpu_precision.py.
"""

import gc
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from toy import blobs, flat_params, loader, mlp
from trainkit.core import Callback, Evaluator, TrainModel
from trainkit.trainer import Classifier, Trainer

pytestmark = pytest.mark.gpu

BENCH = Path(__file__).resolve().parents[2] / "bench" / "gpu_throughput.py"
DIAGNOSTICS = BENCH.with_name("throughput_diagnostics.py")


class WideActivations(TrainModel):
    """``head(mean_w(relu(x * scale_w)))``: activations of ``features * width`` floats per
    sample from ``width`` parameters, so the batch that fits is set by ``width`` alone."""

    def __init__(self, features: int, width: int, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.scale = nn.Parameter(1 + 0.1 * torch.randn(width))
        self.head = nn.Linear(features, 2)

    def forward(self, batch):
        wide = torch.relu(batch[0][:, :, None] * self.scale)  # N x features x width
        return self.head(wide.mean(-1))

    def loss(self, outputs, batch):
        return F.cross_entropy(outputs, batch[1])


def width_for(free_bytes: int, batch: int, features: int, overfill: float = 2.0) -> int:
    """The width at which one ``batch``-sized activation alone is ``overfill`` x free memory."""
    return math.ceil(overfill * free_bytes / (batch * features * 4))


class BatchLosses(Callback):
    def __init__(self):
        self.losses = []

    def after_train_batch(self, state, logger):
        self.losses.append(float(state.total_loss))


def fit_wide(width, batch, features, microbatch, device="cuda"):
    losses = BatchLosses()
    model = WideActivations(features, width)
    trainer = Trainer(
        model=model,
        optimizers=torch.optim.SGD(model.parameters(), lr=0.1),
        train_dataloader=loader(blobs(3 * batch, features), batch_size=batch, shuffle=False),
        max_duration="3ba",
        device=device,
        device_train_microbatch_size=microbatch,
        callbacks=[losses],
        progress_bar=False,
        seed=0,
    )
    trainer.fit()
    result = (trainer.state.device_train_microbatch_size, losses.losses, flat_params(model).cpu())
    del trainer, model
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    return result


def test_auto_microbatching_halves_on_a_real_cuda_oom_and_matches_the_size_it_lands_on():
    batch, features = 64, 16
    gc.collect()
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info()
    # The full batch's first activation alone is twice the free memory: it cannot fit.
    width = width_for(free, batch, features)
    landed, losses, params = fit_wide(width, batch, features, "auto")
    assert landed < batch and batch % landed == 0 and (batch // landed) & (batch // landed - 1) == 0
    assert len(losses) == 3 and all(math.isfinite(loss) for loss in losses)
    fixed, fixed_losses, fixed_params = fit_wide(width, batch, features, landed)
    assert fixed == landed
    torch.testing.assert_close(losses, fixed_losses, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(params, fixed_params, rtol=1e-5, atol=1e-6)


class WideScores(nn.Module):
    """`WideActivations` as a classifier's network (inputs -> scores)."""

    def __init__(self, features: int, width: int):
        super().__init__()
        self.scale = nn.Parameter(1 + 0.1 * torch.randn(width))
        self.head = nn.Linear(features, 2)

    def forward(self, inputs):
        return self.head(torch.relu(inputs[:, :, None] * self.scale).mean(-1))


def test_auto_eval_microbatching_halves_on_a_real_cuda_oom_and_keeps_the_metrics():
    batch, features = 64, 16
    gc.collect()
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info()
    torch.manual_seed(0)
    model = Classifier(WideScores(features, width_for(free, batch, features)), num_classes=2)
    trainer = Trainer(model=model, max_duration="1ba", device="cuda", progress_bar=False, seed=0)
    data = loader(blobs(3 * batch, features), batch_size=batch, shuffle=False)
    auto = Evaluator(label="eval", data=data, device_eval_microbatch_size="auto")
    metrics = {k: float(v) for k, v in trainer.eval(auto).items()}
    landed = auto.device_eval_microbatch_size
    assert landed is not None and landed < batch and batch % landed == 0
    assert int(trainer.state.eval_metrics["eval"]["accuracy"].count) == 3 * batch
    fixed = Evaluator(label="eval", data=data, device_eval_microbatch_size=landed)
    expected = {k: float(v) for k, v in trainer.eval(fixed).items()}
    assert metrics == pytest.approx(expected, rel=1e-5)
    del trainer, model
    gc.collect()
    torch.cuda.empty_cache()


class Losses(Callback):
    def __init__(self):
        self.losses = []

    def after_loss(self, state, logger):
        self.losses.append(float(state.loss.detach()))


def fit_mlp(device="cuda", **kwargs):
    losses = Losses()
    model = mlp(dropout=0.0)
    trainer = Trainer(
        model=model,
        optimizers=torch.optim.AdamW(model.parameters(), lr=0.02),
        train_dataloader=loader(blobs(256), batch_size=32, shuffle=False),
        max_duration="3ep",
        device=device,
        callbacks=[losses],
        progress_bar=False,
        seed=0,
        **kwargs,
    )
    trainer.fit()
    return losses.losses


@pytest.mark.parametrize("compile_option", [True, {"dynamic": False}])
def test_compile_on_cuda_trains_to_the_eager_loss(compile_option):
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = fit_mlp(compile=compile_option)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > 0  # dynamo captured it
    eager = fit_mlp()
    torch.testing.assert_close(compiled, eager, rtol=1e-3, atol=1e-3)
    assert sum(compiled[-8:]) < 0.5 * sum(compiled[:8])


def run_bench(tmp_path, *options, script=BENCH):
    """A bench (gpu_throughput.py), each variant in its own fresh process; its results by name."""
    out = tmp_path / "results.json"
    command = [sys.executable, str(script), *options, "--json", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    results = {r["variant"]: r for r in json.loads(out.read_text())["results"]}
    errors = {name: r["error"] for name, r in results.items() if "error" in r}
    assert not errors, f"{errors}\n{done.stdout}"
    return results, done.stdout


def test_trainer_peak_memory_is_within_one_percent_of_the_hand_written_loop(tmp_path):
    # GPT-2 small (transformers, from a config), bf16 autocast, fused AdamW, same batches.
    results, table = run_bench(
        tmp_path, "--seq", "512", "--batch", "8", "--steps", "3", "--warmup", "2",
        "--variants", "eager,trainer",
    )  # fmt: skip
    eager, trainer = results["eager"]["peak_bytes"], results["trainer"]["peak_bytes"]
    assert trainer <= 1.01 * eager, table
    assert math.isfinite(results["trainer"]["loss"])


def test_bench_trace_on_cuda_counts_kernels_launches_and_device_time(tmp_path):
    results, table = run_bench(
        tmp_path, "--seq", "128", "--batch", "4", "--steps", "2", "--warmup", "2",
        "--trace", "2", "--variants", "eager,trainer", script=DIAGNOSTICS,
    )  # fmt: skip
    for result in results.values():
        profile = result["profile"]
        assert 0 < profile["device_ms"] <= 1.05 * profile["wall_ms"], table
        assert profile["launches"] > 50 and profile["kernels_ms"], table
        # Kernels only: not the optimizer's ranges, which the profiler mirrors onto the
        # device's timeline over its kernels.
        assert not any(name.startswith("Optimizer.") for name in profile["kernels_ms"]), table
        assert (
            abs(sum(profile["kernels_ms"].values()) - profile["device_ms"])
            < 0.5 * profile["device_ms"]
        )
        assert 0 <= profile["idle_ms"] < profile["wall_ms"], table
        assert all(ms > 0 and name for ms, name in profile["largest_gaps"]), table
    assert "trainer - eager, device ms per step" in table
    assert "trainer - eager, aten ops per step" in table
