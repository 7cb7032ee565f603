"""The embedded default run of ``trainkit train``: the preset it picks for the hardware, the
wall-clock budget and its schedule, the held-out split and the compressors' baselines, and a
seconds-long run end to end (with the `Generate` sample when trainkit-loggers is installed).
"""

import gzip
import json
import logging
import lzma
import math
import os
import random
import sysconfig
import time
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
import yaml

from multirank import run_ranks
from trainkit.cli import _plan, _train, main
from trainkit.cli._config import load_config
from trainkit.cli._default import (
    HeldOutWindows,
    compressor_baselines,
    python_sources,
    tiny_gpt2,
)
from trainkit.cli._plan import (
    CPU,
    GPU,
    WarmupCosine,
    choose_plan,
    default_config,
    preset,
    share_cores,
)
from trainkit.core import Time, Timestamp, plugins

has_generate = "generate" in plugins.available("trainkit.callbacks")


# --- the hardware choice ---------------------------------------------------------------


def test_cpu_preset_is_fp32_eager_with_every_idle_core():
    plan = choose_plan("cpu", cpu_threads=3, busy=0.2)
    assert plan.device == "cpu" and plan.threads == 3 and not plan.notes
    assert plan.precision == "fp32" and not plan.compile
    assert 0 < plan.budget_s < _plan.TOTAL_BUDGET_S


@pytest.mark.parametrize(("cores", "busy", "threads"), [(2, 0.6, 1), (2, 4.5, 1), (16, 3.7, 12)])
def test_busy_cores_are_left_to_the_other_work(cores, busy, threads):
    plan = choose_plan("cpu", cpu_threads=cores, busy=busy)
    assert plan.threads == threads
    assert plan.notes == [
        f"{threads} of {cores} CPU threads: the machine is busy ({busy:.1f} cores in use)"
    ]


def test_ranks_on_one_machine_share_its_idle_cores(monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    plan = choose_plan("cpu", cpu_threads=8, busy=2.0)
    assert plan.threads == 3
    assert plan.notes[-1] == "3 thread(s) per rank: 2 ranks share 6 idle cores"
    assert choose_plan("cpu", cpu_threads=2, busy=0.0).threads == 1
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "two")
    with pytest.raises(ValueError, match="LOCAL_WORLD_SIZE must be an integer, got 'two'"):
        choose_plan("cpu", cpu_threads=2, busy=0.0)


def _thread_choice(rank, world_size, starting_up):
    # A rank of `trainkit launch -n 2` on one machine: rank 1 is still starting up (importing
    # torch, reading its data) when rank 0 is ready; busy_cores records when it measures.
    os.environ["LOCAL_WORLD_SIZE"] = str(world_size)
    measured = []
    _plan.busy_cores = lambda cores: measured.append(time.monotonic()) or 0.0
    if rank == 1:
        time.sleep(starting_up)
    ready = time.monotonic()
    plan = _train._start_default(preset("cpu"), "1ba", [])
    return ready, measured, plan.threads, plan.notes


def test_ranks_choose_their_threads_once_every_rank_has_started():
    (_, [measured0], threads0, notes), (ready1, [measured1], threads1, _) = run_ranks(
        _thread_choice, 2, 1.0
    )
    # Measured before rank 1 was ready, its start-up would count as other work.
    assert measured0 >= ready1 and measured1 >= ready1
    cores = len(os.sched_getaffinity(0))
    assert threads0 == threads1 == max(1, cores // 2)
    assert notes[-1] == f"{threads0} thread(s) per rank: 2 ranks share {cores} idle cores"


def _stat(jiffies):
    """A /proc/stat with a total line and one line per CPU: (busy, idle) jiffies each."""
    lines = ["cpu  999 0 999 999 0 0 0 0 0 0"]  # the total line is ignored
    for cpu, (busy, idle) in enumerate(jiffies):
        lines.append(f"cpu{cpu} {busy} 0 0 {idle} 0 0 0 0 0 0")
    return "\n".join([*lines, "intr 1 2 3", ""])


def test_busy_cores_are_measured_on_the_cpus_this_process_may_use(tmp_path, monkeypatch):
    stat = tmp_path / "stat"
    stat.write_text(_stat([(100, 100), (100, 100), (100, 100)]))
    # Over the sleep: CPU 0 fully busy, CPU 1 half, CPU 2 (not ours) busy but not counted.
    later = _stat([(200, 100), (150, 150), (200, 100)])
    monkeypatch.setattr(_plan.time, "sleep", lambda seconds: stat.write_text(later))
    monkeypatch.setattr(_plan.os, "sched_getaffinity", lambda pid: {0, 1})
    assert _plan.busy_cores(2, stat=str(stat)) == pytest.approx(1.5)
    monkeypatch.setattr(_plan.time, "sleep", lambda seconds: None)  # no time passed
    assert _plan.busy_cores(2, stat=str(stat)) == 0.0


def test_without_proc_stat_the_load_average_counts(tmp_path, monkeypatch):
    monkeypatch.setattr(_plan.os, "getloadavg", lambda: (0.7, 0.0, 0.0))
    assert _plan.busy_cores(2, stat=str(tmp_path / "missing")) == 0.7
    assert choose_plan("cpu", cpu_threads=2).threads >= 1  # the real machine's


def test_gpu_preset_is_larger_bf16_and_compiled():
    plan = choose_plan("cuda")
    assert plan.device == "cuda" and plan.precision == "amp_bf16" and plan.compile
    assert plan.n_layer * plan.n_embd**2 > 10 * CPU.n_layer * CPU.n_embd**2
    assert plan.seq_len > CPU.seq_len and plan.site_packages


def test_the_device_found_picks_the_preset(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert choose_plan().device == "cpu" and choose_plan().threads >= 1
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    assert choose_plan() == GPU
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: False)
    older = choose_plan()
    assert older.precision == "amp_fp16" and older.notes


def test_unknown_device_is_refused():
    with pytest.raises(ValueError, match="device 'mps' has no preset; use 'cpu' or 'cuda'"):
        choose_plan("mps")


@pytest.mark.parametrize("plan", [CPU, GPU], ids=["cpu", "gpu"])
def test_each_preset_is_a_valid_config_with_a_wall_clock_budget(plan, tmp_path):
    config = load_config(None, base=default_config(plan, has_generate), run_dir=tmp_path)
    trainer = config.trainer
    assert Time.from_timestring(trainer["max_duration"]) == Time(plan.budget_s, "sec")
    assert trainer["precision"] == plan.precision and trainer["compile"] == plan.compile
    assert trainer["device"] == plan.device
    model = config.components["model"].options
    assert (model["n_layer"], model["n_embd"], model["n_positions"]) == (
        plan.n_layer,
        plan.n_embd,
        plan.seq_len,
    )
    line = plan.describe()
    for part in (plan.device, plan.precision, f"budget {plan.budget_s} s", "batch", "seq"):
        assert part in line


# --- the budget and its schedule -------------------------------------------------------


def _at(batch, seconds, budget):
    timestamp = Timestamp(batch=batch, total_wct=seconds)
    max_duration = Time(budget, "sec")
    return SimpleNamespace(
        timestamp=timestamp,
        elapsed_fraction=lambda: timestamp.get(max_duration.unit) / max_duration.value,
    )


def test_schedule_warms_up_by_batches_and_decays_over_the_wall_budget():
    schedule = WarmupCosine(warmup_batches=10, alpha_f=0.1)
    # A slow first (compiling) step took half the budget: the warm-up still counts batches.
    assert schedule(_at(1, 50.0, 100)) == pytest.approx(0.1 * (0.1 + 0.9 * 0.5))
    assert schedule(_at(10, 0.0, 100)) == pytest.approx(1.0)
    assert schedule(_at(20, 50.0, 100)) == pytest.approx(0.55)
    assert schedule(_at(30, 100.0, 100)) == pytest.approx(0.1)  # ends at the budget
    assert schedule(_at(31, 130.0, 100)) == pytest.approx(0.1)


def test_schedule_options_are_checked():
    with pytest.raises(ValueError, match="warmup_batches must be an int >= 0, got -1"):
        WarmupCosine(warmup_batches=-1)
    with pytest.raises(ValueError, match=r"alpha_f must be in \[0, 1\], got 2"):
        WarmupCosine(alpha_f=2)


# --- the data --------------------------------------------------------------------------


@pytest.fixture
def fake_python(tmp_path, monkeypatch):
    """A stdlib and a site-packages of generated files, each with a marker of its own."""
    rng = random.Random(0)
    stdlib, purelib = tmp_path / "lib", tmp_path / "site"
    markers = {}
    for root, count in ((stdlib, 40), (purelib, 10)):
        for i in range(count):
            folder = root / ("tests" if i == 0 else f"pkg{i % 3}")
            folder.mkdir(parents=True, exist_ok=True)
            marker = f"MARK_{root.name}_{i}_"
            body = "".join(rng.choice("abc =()\n") for _ in range(rng.randrange(200, 600)))
            (folder / f"m{i}.py").write_text(f"# {marker}\n{body}")
            markers[folder / f"m{i}.py"] = marker
    (stdlib / "copy_of_m5.py").write_bytes((stdlib / "pkg2" / "m5.py").read_bytes())
    real = sysconfig.get_paths()
    monkeypatch.setattr(
        sysconfig, "get_paths", lambda: {**real, "stdlib": str(stdlib), "purelib": str(purelib)}
    )
    return stdlib, purelib, markers


def test_held_out_files_are_never_trained_on(fake_python):
    _, _, markers = fake_python
    train, held_out, files = python_sources(eval_bytes=2000, site_packages=True)
    assert len(held_out) == 2000 and files >= 2
    held_markers = [m for m in markers.values() if m.encode() in held_out]
    assert len(held_markers) == files  # whole files: every held-out file's marker is there
    for marker in held_markers:
        assert marker.encode() not in train
    assert b"MARK_lib_0_" not in train + held_out  # tests/ folders are skipped
    assert b"MARK_site_1_" in train  # the installed packages' source, when asked
    if b"MARK_lib_5_" in held_out:  # its copy under another name is not trained on either
        assert b"MARK_lib_5_" not in train


def test_max_bytes_limits_the_training_text(fake_python):
    train, _, _ = python_sources(eval_bytes=1000, max_bytes=3000)
    assert len(train) == 3000


def test_eval_windows_score_every_byte_once():
    data = bytes(random.Random(1).randrange(256) for _ in range(1000))
    windows = HeldOutWindows(data, seq_len=64, stride=24)
    scored = []
    for index in range(len(windows)):
        item = windows[index]
        start = windows.starts[index]
        # The model predicts position j from positions < j: label j counts when not -100.
        for j in range(1, 64):
            if item["labels"][j] != -100:
                assert item["labels"][j] == data[start + j]
                scored.append(start + j)
    assert scored == list(range(1, len(data)))
    assert windows.scored_bytes() == data


def test_compressor_baselines_are_on_the_scored_bytes():
    data = b"def f(x):\n    return x + 1\n" * 50 + bytes(range(256))
    windows = HeldOutWindows(data, seq_len=32, stride=16)
    baselines = compressor_baselines(windows.scored_bytes())
    assert baselines["gzip -9"] == pytest.approx(
        len(gzip.compress(data, compresslevel=9, mtime=0)) * 8 / len(data)
    )
    assert baselines["xz -9"] == pytest.approx(len(lzma.compress(data, preset=9)) * 8 / len(data))


def test_the_default_model_reports_bits_per_byte_as_its_cross_entropy_in_bits():
    model = tiny_gpt2(n_layer=1, n_head=2, n_embd=32, n_positions=32)
    metrics = model.get_metrics(is_train=False)
    logits, target = torch.randn(2, 5, 256), torch.randint(0, 256, (2, 5))
    target[0, 0] = -100
    for metric in metrics.values():
        metric.update(logits, target)
    bits, nats = metrics["bits_per_byte"].compute(), metrics["cross_entropy"].compute()
    assert bits == pytest.approx(nats / math.log(2))


def test_the_default_model_trains_without_a_warning_from_transformers():
    # transformers 5 names a model's loss from its class; "GPT2LMHeadModel" names none, and
    # without help every default run printed that the loss type was unrecognised.
    from transformers.utils import logging as hf_logging

    heard: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: heard.append(record.getMessage())
    hf_logging.get_logger("transformers").addHandler(handler)
    hf_logging.warning_once.cache_clear()  # an earlier test in this process may have warned
    try:
        model = tiny_gpt2(n_layer=1, n_head=2, n_embd=32, n_positions=32)
        batch = {"input_ids": torch.randint(0, 256, (2, 16))}
        batch["labels"] = batch["input_ids"]
        loss = model.loss(model(batch), batch)
    finally:
        hf_logging.get_logger("transformers").removeHandler(handler)
    assert torch.isfinite(loss)
    assert heard == []


# --- a run of a few seconds, end to end ------------------------------------------------


TINY_CPU = replace(
    CPU, n_layer=1, n_head=2, n_embd=32, seq_len=32, batch_size=4, budget_s=2, warmup_batches=2
)
SMALL_DATA = ["--set", "data.max_bytes=60000", "--set", "data.eval_bytes=4096"]


@pytest.fixture(autouse=True)
def _keep_torch_threads():
    """The default run sets torch's thread count for the process; give it back."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_a_tiny_budget_run_ends_on_time_and_writes_the_sample(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(_train, "preset", lambda: TINY_CPU)
    # As on 2 idle cores, whatever this machine's are doing now.
    monkeypatch.setattr(_train, "share_cores", lambda plan: share_cores(plan, 2, busy=0.0))
    run_dir = tmp_path / "run"
    assert main(["train", "--run-dir", str(run_dir), *SMALL_DATA]) == 0
    out = capsys.readouterr().out
    assert out.startswith(TINY_CPU.describe())
    assert "budget 2 s of training" in out
    assert "overridden with --set: data.max_bytes=60000 data.eval_bytes=4096\n" in out
    trained = next(line for line in out.splitlines() if line.startswith("trained "))
    seconds = float(trained.split(" in ")[1].removesuffix(" s"))
    assert seconds >= 1.5  # stopped by the wall-clock budget (printed rounded)
    held_out = next(line for line in out.splitlines() if line.startswith("held-out bits/byte"))
    assert "model " in held_out and "gzip -9 " in held_out and "xz -9 " in held_out
    sample = (run_dir / "sample.txt").read_text()
    assert sample.startswith(_plan.PROMPT) and "sample:\n" + sample in out
    if has_generate:  # with trainkit-loggers: metrics and the Generate sample in the file
        written = (run_dir / "metrics.jsonl").read_text()
        lines = [json.loads(line) for line in written.splitlines()]
        metrics = {k: v for line in lines for k, v in line.get("metrics", {}).items()}
        assert metrics["baseline/gzip_bits_per_byte"] > 0
        assert "metrics/eval/bits_per_byte" in metrics
        tables = [line["table"] for line in lines if "table" in line]
        assert tables and tables[-1]["name"] == "sample"
        prompt, decoding, text = tables[-1]["rows"][0]
        assert (prompt, decoding) == (_plan.PROMPT, "sample") and sample == prompt + text
        assert len(text.encode("utf-8", "replace")) > 0


def test_the_gpu_preset_runs_its_code_path_on_cpu(tmp_path, capsys, monkeypatch):
    """The GPU preset's config (bf16 autocast, torch.compile, site-packages data), faked
    as the device found and shrunk; run on the CPU with a compile backend that is quick."""
    tiny_gpu = replace(
        GPU, n_layer=1, n_head=2, n_embd=32, seq_len=32, batch_size=4, budget_s=3, max_bytes=60000
    )
    monkeypatch.setattr(_train, "preset", lambda: tiny_gpu)
    run_dir = tmp_path / "run"
    args = ["train", "--run-dir", str(run_dir), "--set", "data.eval_bytes=4096"]
    assert main([*args, "--print-config"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["trainer"]["device"] == "cuda" and printed["trainer"]["compile"] is True
    assert printed["trainer"]["precision"] == "amp_bf16" and printed["data"]["site_packages"]
    cpu = ["--set", "trainer.device=cpu", "--set", "trainer.compile={backend: eager}"]
    assert main([*args, *cpu]) == 0
    out = capsys.readouterr().out
    assert "precision amp_bf16, compile on" in out and "held-out bits/byte" in out
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert config["trainer"]["precision"] == "amp_bf16"
