"""bench/time_to_quality.py: how it reads the time to quality off the evaluation marks, and
one short run of a worker on the embedded task."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "time_to_quality.py"


def load():
    spec = importlib.util.spec_from_file_location("time_to_quality", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_time_to_quality_is_read_between_the_marks():
    bench = load()
    marks = [(10.0, 3.0), (20.0, 2.0), (30.0, 1.5)]
    assert bench.time_to(marks, 2.5) == pytest.approx(15.0)  # halfway from 3.0 to 2.0
    assert bench.time_to(marks, 3.0) == 10.0 and bench.time_to(marks, 1.5) == 30.0
    assert bench.time_to(marks, 1.0) is None  # never reached
    runs = [
        {"variant": "baseline", "seed": 0, "marks": marks},
        {"variant": "fast", "seed": 0, "marks": [(10.0, 2.0), (20.0, 1.5), (30.0, 1.2)]},
        {"variant": "slow", "seed": 0, "marks": [(10.0, 3.5), (20.0, 3.0), (30.0, 2.0)]},
        {"variant": "fast", "seed": 1, "error": "exit 1"},
    ]
    summary = bench.summarise(runs)
    assert summary["baseline"]["ratios"] == [1.0]
    assert summary["fast"]["ratios"] == [pytest.approx(20.0 / 30.0)]  # 1.5 at its mark 20
    assert summary["slow"] == {"ratios": [], "finals": [2.0], "missed": 1}


def test_the_variants_are_checked_and_the_baseline_is_required(capsys):
    bench = load()
    with pytest.raises(SystemExit):
        bench.parse_args(["--variants", "baseline,warp_drive"])
    assert "unknown variants ['warp_drive']" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.parse_args(["--variants", "ema"])
    assert "must include baseline" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.parse_args(["--variants", "baseline,rotary+warp_drive"])
    assert "unknown variants ['warp_drive']" in capsys.readouterr().err
    assert bench.parse_args(["--variants", "baseline,rotary+wsd"]).variants == [
        "baseline",
        "rotary+wsd",
    ]


def test_a_composition_applies_each_part_and_a_recipe_its_registered_sections():
    bench = load()
    config = {"schedulers": [{"name": "cosine"}]}
    for part in bench.parts("relu_squared + wsd"):
        bench.VARIANTS[part][1](config)
    assert config == {
        "schedulers": [{"name": "wsd", "t_warmup": "0.05dur"}],
        "algorithms": [{"name": "relu_squared"}],
    }
    recipe = {"schedulers": [{"name": "cosine"}]}
    bench.VARIANTS["lm_fast"][1](recipe)
    assert recipe == {"recipe": "lm_fast"}  # the recipe's own schedule replaces the default's


def test_a_worker_trains_the_embedded_task_and_evaluates_at_each_mark(tmp_path):
    command = [sys.executable, str(BENCH), "--budget", "6", "--marks", "2", "--eval-bytes",
               "4096", "--threads", "1", "--worker", "lm_fast+ema:0"]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    result = load().json.loads(done.stdout.splitlines()[-1].removeprefix("RESULT "))
    marks = result["marks"]
    assert [round(t / 3) for t, _ in marks] == [1, 2]  # at 3 and 6 s of training
    assert all(0.0 < bits < 8.5 for _, bits in marks)  # bits per byte of a byte model
    assert set(result["compressors"]) == {"gzip -9", "xz -9"}
    assert all(1.0 < bits < 8.0 for bits in result["compressors"].values())
    assert not list(tmp_path.iterdir())  # nothing written where it ran
