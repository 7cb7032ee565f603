"""bench/gpu_throughput.py on CPU: the figures it compares; bench/throughput_diagnostics.py:
its changes, phases and --trace's profile of the steps after the timed ones (the GPU figures:
tests/trainer/test_gpu_training.py)."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
PARITY = BENCH / "gpu_throughput.py"
DIAGNOSTICS = BENCH / "throughput_diagnostics.py"


def load(path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_bench():
    """The diagnostics, on a fresh copy of gpu_throughput (a test's patches stay its own)."""
    sys.modules.pop("gpu_throughput", None)
    return load(DIAGNOSTICS)


def test_the_parity_report_names_each_ratio_against_its_target(capsys):
    parity = load(PARITY)
    args = parity.parse_args(["--device", "cpu", "--variants", "eager,trainer,fsdp,trainer_fsdp"])
    results = [
        {"variant": name, "tokens_per_s": speed, "peak_bytes": peak, "loss": 1.0,
         "params": 124_000_000, "device": "NVIDIA H200"}
        for name, speed, peak in (("eager", 100.0, 1000), ("trainer", 99.5, 1011),
                                  ("fsdp", 100.0, 1000), ("trainer_fsdp", 98.0, 1000))
    ]  # fmt: skip
    missed = parity.report(args, results)
    out = capsys.readouterr().out
    assert "trainer/eager: tokens/s 0.995 (>= 0.99), peak memory 1.0110 (<= 1.01)" in out
    assert missed == ["trainer memory 1.0110", "trainer_fsdp speed 0.980"]
    # MFU: 6 * N * tokens/s over the H200's dense bf16 peak.
    mfu = 6 * 124e6 * 100.0 / 989.4e12
    assert f"{mfu:6.1%}" in out.splitlines()[2]
    # The parity script knows only the parity variants; the diagnostics' live apart.
    for wrong in ("fsdp_mesh", "eager+zero_first"):
        with pytest.raises(SystemExit):
            parity.parse_args(["--variants", wrong])
        assert "unknown variants" in capsys.readouterr().err


def test_the_parity_loops_train_the_same_model_on_the_same_batches():
    parity = load(PARITY)
    import torch

    threads = torch.get_num_threads()
    args = parity.parse_args(["--tiny", "--device", "cpu", "--steps", "2", "--warmup", "1"])
    results = {}
    try:
        for variant in ("eager", "fsdp", "trainer"):
            args.worker = variant
            results[variant] = parity.run_worker(args)
    finally:
        torch.set_num_threads(threads)
    eager, fsdp, trainer = results.values()
    # FSDP2 on one rank (gloo) is the hand-written loop; the Trainer trains the same model
    # on the same batches (only dropout's masks differ: it seeds its own generators).
    assert fsdp["loss"] == pytest.approx(eager["loss"], rel=1e-5)
    assert trainer["loss"] == pytest.approx(eager["loss"], rel=5e-2)
    assert eager["params"] == trainer["params"] > 0
    assert all(r["tokens_per_s"] > 0 and r["peak_bytes"] is None for r in results.values())
    assert not torch.distributed.is_initialized()  # the one-rank group is gone


def test_idle_gaps_are_the_device_time_no_stream_was_busy():
    idle_gaps = load_bench().idle_gaps
    assert idle_gaps([]) == (0.0, [])
    # Two streams overlap (0-10 and 5-12): one busy stretch; then idle 12-20 before
    # "embedding", 25-26 before "adam", and nothing between touching kernels.
    work = [
        (20.0, 25.0, "embedding"), (0.0, 10.0, "gemm"), (5.0, 12.0, "nccl"),
        (26.0, 30.0, "adam"), (30.0, 31.0, "copy"),
    ]  # fmt: skip
    idle, gaps = idle_gaps(work)
    assert idle == 9.0
    assert gaps == [(8.0, "embedding"), (1.0, "adam")]
    assert idle_gaps(work, largest=1)[1] == [(8.0, "embedding")]


def test_ranges_the_profiler_mirrors_onto_the_device_are_not_device_work():
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    bench = load_bench()

    def event(key, device, own_us, annotation=False, count=1):
        cuda = device == DeviceType.CUDA
        return SimpleNamespace(
            key=key, device_type=device, count=count, is_user_annotation=annotation,
            self_device_time_total=own_us if cuda else 0.0,
            self_cpu_time_total=0.0 if cuda else own_us,
        )  # fmt: skip

    averages = [
        event("gemm", DeviceType.CUDA, 3000.0),
        event("Memcpy HtoD (Pinned -> Device)", DeviceType.CUDA, 1000.0),
        # FSDP's range around a block's forward, as the profiler puts it on the device's
        # timeline: it spans the block's kernels and the idle time between them.
        event("FSDP::pre_forward (model.transformer.h.0)", DeviceType.CUDA, 9000.0, True),
        event("FSDP::pre_forward (model.transformer.h.0)", DeviceType.CPU, 500.0, True),
        event("aten::mm", DeviceType.CPU, 200.0, count=4),
        event("cudaLaunchKernel", DeviceType.CPU, 100.0, count=6),
    ]
    summary = bench.summarise(averages, wall=0.01, steps=2)
    assert summary["device_ms"] == 2.0  # (3 + 1 ms) over 2 steps: the range not counted
    assert summary["kernels_ms"] == {"gemm": 1.5, "Memcpy HtoD (Pinned -> Device)": 0.5}
    # The host's own time inside the range (Python between its operators) still counts.
    assert summary["host_ms"]["FSDP::pre_forward (transformer.h.0)"] == 0.25
    assert (summary["launches"], summary["aten_ops"]) == (3.0, 2.0)
    assert [bench.on_device(e) for e in averages] == [True, True, False, False, False, False]


def test_the_report_walks_from_fsdp_to_the_trainer_one_change_at_a_time(capsys):
    bench = load_bench()
    args = bench.parse_args(["--device", "cpu", "--variants", "fsdp,trainer_fsdp,fsdp_mesh"])
    results = [
        {"variant": name, "tokens_per_s": speed, "peak_bytes": None, "loss": 1.0,
         "params": 1, "device": "cpu"}
        for name, speed in (("fsdp", 100.0), ("fsdp_mesh", 99.0), ("fsdp_wrapped", 98.0),
                            ("trainer_fsdp", 97.02))
    ]  # fmt: skip
    bench.report(args, results)
    out = capsys.readouterr().out
    assert "trainer_fsdp/fsdp: tokens/s 0.970" in out
    assert (
        "fsdp -> trainer_fsdp, one change at a time: fsdp_mesh/fsdp 0.990, "
        "fsdp_wrapped/fsdp_mesh 0.990, trainer_fsdp/fsdp_wrapped 0.990"
    ) in out
    assert bench.pairs({"fsdp": 0, "trainer_fsdp": 0, "fsdp_wrapped": 0}) == [
        ("trainer_fsdp", "fsdp"),
        ("trainer_fsdp", "fsdp_wrapped"),
    ]
    # The two diagnostic variants run only when named.
    assert "fsdp_mesh" not in bench.parse_args([]).variants
    with pytest.raises(SystemExit):
        bench.parse_args(["--variants", "fsdp_meshh"])


def test_changes_are_checked_and_reported_against_the_unchanged_variant(capsys):
    bench = load_bench()
    assert bench.split_variant("fsdp_wrapped+zero_first+host_between=500") == (
        "fsdp_wrapped",
        {"zero_first": "", "host_between": "500"},
    )
    assert bench.split_variant("eager") == ("eager", {})
    for variants, problem in (
        ("eager+nope", "unknown change 'nope'"),
        ("trainer+zero_first", "zero_first applies to eager, compile"),
        ("eager+split_autocast", "split_autocast applies to fsdp_wrapped, not eager"),
        ("fsdp_wrapped+host_between", "host_between needs a number of microseconds"),
        ("trainer+no_gc_freeze=1", "no_gc_freeze takes no value"),
        ("lightning+host_between=5", "host_between applies to"),
        ("eagr+zero_first", "unknown variants ['eagr']"),
    ):
        with pytest.raises(SystemExit):
            bench.parse_args(["--variants", variants])
        assert problem in capsys.readouterr().err, variants
    args = bench.parse_args(["--device", "cpu", "--variants", "fsdp_wrapped+reverse_blocks"])
    assert args.variants == ["fsdp_wrapped+reverse_blocks"]
    results = [
        {"variant": name, "tokens_per_s": speed, "peak_bytes": None, "loss": 1.0,
         "params": 1, "device": "cpu"}
        for name, speed in (("fsdp_wrapped", 100.0), ("fsdp_wrapped+zero_first", 99.0),
                            ("trainer+no_loss_watch", 50.0))
    ]  # fmt: skip
    bench.report(args, results)
    out = capsys.readouterr().out
    # Against its own variant; one whose unchanged variant did not run is left out.
    assert "changed variants against their own: fsdp_wrapped+zero_first/fsdp_wrapped 0.990\n" in out
    assert bench.pairs({"fsdp_wrapped": 0, "fsdp_wrapped+zero_first": 0}) == [
        ("fsdp_wrapped+zero_first", "fsdp_wrapped")
    ]


def test_changes_move_the_work_and_keep_the_training(monkeypatch):
    bench = load_bench()
    import torch

    from trainkit.trainer._nonfinite import LossWatch

    # The Trainer's changes patch these for their (fresh) process: restored after the test.
    monkeypatch.setattr(LossWatch, "update", LossWatch.update)
    monkeypatch.setattr(torch.optim.Optimizer, "zero_grad", torch.optim.Optimizer.zero_grad)
    # The bench's clock advances 1 us per reading, not with the machine: the busy host's
    # time is then the same in every run, and a stall of this shared machine lands nowhere
    # (a real clock once put 12 ms of it in one run's two timed forwards).
    monkeypatch.setattr(bench, "time", ReadingClock())
    threads = torch.get_num_threads()
    args = bench.parse_args(["--tiny", "--device", "cpu", "--steps", "2", "--warmup", "1"])
    args.phases = True
    results = {}
    try:
        for variant in (
            "eager",
            "eager+zero_first+loss_watch+host_between=30000+host_forward=20000",
            "eager+trainer_data",
            "trainer",
            "trainer+no_loss_watch+zero_after_step+no_gc_freeze+host_forward=20000",
        ):
            args.worker = variant
            results[variant] = bench.parity.run_worker(
                args, bench.run_variant, bench.DiagnosticClock
            )
    finally:
        torch.set_num_threads(threads)
    eager, changed, data, trainer, changed_trainer = results.values()
    # The same training: where zero_grad runs and checking the loss change no number.
    assert changed["loss"] == eager["loss"]
    # The same batches through DataSpec; only dropout's masks differ: iterating a plain
    # DataLoader draws a seed from the global generator, the resumable one from its own.
    assert data["loss"] == pytest.approx(eager["loss"], rel=1e-2)
    assert changed_trainer["loss"] == trainer["loss"]

    # The host kept busy where asked, and only there: between the steps (before the next
    # forward) and between the loss and the backward, 30 and 20 ms a step. The other
    # readings in a phase (its marks, the garbage collector's callbacks) add a few us.
    def more(mine, theirs, phase):
        return mine["phases"]["host_ms"][phase] - theirs["phases"]["host_ms"][phase]

    def near(ms):
        return pytest.approx(ms, abs=0.1)

    assert more(changed, eager, "before forward") == near(30.0)
    assert more(changed, eager, "forward+loss") == near(20.0)
    assert more(changed, eager, "backward") == near(0.0)
    assert more(changed, eager, "optimizer") == near(0.0)
    assert more(changed_trainer, trainer, "forward+loss") == near(20.0)
    assert more(changed_trainer, trainer, "before forward") == near(0.0)
    assert more(changed_trainer, trainer, "backward") == near(0.0)


class ReadingClock:
    """A stand-in for the bench's ``time`` module: ``perf_counter`` advances 1 us a call."""

    def __init__(self):
        self.readings = 0

    def perf_counter(self):
        self.readings += 1
        return self.readings * 1e-6


def test_trace_profiles_the_steps_after_the_timed_ones(tmp_path):
    out = tmp_path / "results.json"
    command = [
        sys.executable, str(DIAGNOSTICS), "--tiny", "--device", "cpu", "--steps", "2", "--warmup", "1",
        "--trace", "2", "--pyprofile", "2", "--phases", "--variants",
        "eager,trainer,fsdp_wrapped,fsdp_wrapped+split_autocast+reverse_blocks+broadcast",
        "--json", str(out),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    results = {r["variant"]: r for r in json.loads(out.read_text())["results"]}
    for variant in ("eager", "trainer"):
        result = results[variant]
        assert result["tokens_per_s"] > 0
        profile = result["profile"]
        # CPU: operators and wall time, no device work.
        assert profile["wall_ms"] > 0
        assert profile["aten_ops"] > 10  # a GPT-2 step runs hundreds
        assert profile["device_ms"] == 0 and profile["kernels_ms"] == {}
        assert profile["idle_ms"] == 0 and profile["largest_gaps"] == []
        assert sum(profile["aten_counts"].values()) == profile["aten_ops"]
    assert "per traced step" in done.stdout
    # Where the host's time goes, per operator: the forward's matmuls among them.
    assert results["trainer"]["profile"]["host_ms"]["aten::addmm"] > 0
    assert "trainer - eager, host ms per step (own time)" in done.stdout
    # fsdp_wrapped: trainkit's FSDP2 options and the Trainer's calls of a HuggingFaceModel
    # (the label-token count included) in a hand-written loop: eager's loss on one rank.
    wrapped = results["fsdp_wrapped"]
    assert wrapped["loss"] == pytest.approx(results["eager"]["loss"], rel=1e-5)
    # Its loss in an autocast region of its own, the blocks sharded last to first, the
    # weights broadcast first: the same training.
    assert results["fsdp_wrapped+split_autocast+reverse_blocks+broadcast"]["loss"] == (
        pytest.approx(wrapped["loss"], rel=1e-6)
    )
    assert (
        "changed variants against their own: "
        "fsdp_wrapped+split_autocast+reverse_blocks+broadcast/fsdp_wrapped"
    ) in done.stdout
    counts = wrapped["profile"]["aten_counts"]
    assert (
        counts["aten::clamp"] - results["eager"]["profile"]["aten_counts"].get("aten::clamp", 0)
        == 1
    )
    # --phases: the timed steps cut at the forward, the backward and the optimizer step;
    # on CPU host times only. The phases add up to the timed steps' wall time.
    for variant in ("eager", "trainer"):
        result = results[variant]
        phases = result["phases"]
        assert phases["steps"] == 2 and phases["device_ms"] is None
        host = phases["host_ms"]
        assert list(host) == ["before forward", "forward+loss", "backward", "optimizer"]
        assert all(ms > 0 for ms in host.values())
        timed_ms = 1e3 * 4 * 32 * 2 / result["tokens_per_s"] / 2  # batch 4, seq 32, 2 steps
        assert sum(host.values()) == pytest.approx(timed_ms, rel=0.1)
        assert phases["gc_ms"] >= 0 and phases["gc_collections"] >= 0
    assert "trainer - eager, host ms per step: before forward" in done.stdout
    # Per pair, the operators each step runs more or less often: the Trainer hands
    # transformers the label-token count, clamped to >= 1 (HuggingFaceModel.forward).
    counts = {v: results[v]["profile"]["aten_counts"] for v in ("eager", "trainer")}
    assert counts["trainer"]["aten::clamp"] - counts["eager"].get("aten::clamp", 0) == 1
    report = done.stdout.split("trainer - eager, aten ops per step")[1]
    assert "+1.0  aten::clamp" in report
    # --pyprofile: the host's Python per function over 2 more steps. The Trainer's own
    # functions run once a step, and only in the Trainer.
    python = {v: results[v]["python"] for v in ("eager", "trainer")}
    assert python["trainer"]["own_ms_total"] > 0 and python["trainer"]["calls_total"] > 100
    [microbatches] = [f for f in python["trainer"]["calls"] if f.endswith("(run_microbatches)")]
    assert microbatches.startswith("trainkit/trainer/_step.py:")
    assert python["trainer"]["calls"][microbatches] == 1.0
    assert not any(f.startswith("trainkit/") for f in python["eager"]["own_ms"])
    assert "trainer - eager, own ms per step by function" in done.stdout
    # Tracing and profiling add steps after the timed ones; the loss reported is the last timed step's
    # in every variant, as without --trace.
    again = subprocess.run(
        [*command[: command.index("--trace")], "--variants", "eager", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert again.returncode == 0, again.stderr[-3000:]
    [untraced] = json.loads(out.read_text())["results"]
    assert "profile" not in untraced and "python" not in untraced
    assert untraced["loss"] == results["eager"]["loss"]
