"""examples/core_loop.py: a loop written on trainkit-core alone runs trainkit-algorithms.

The example runs in a fresh interpreter in which every trainkit package but trainkit-core
and trainkit-algorithms is hidden (in core's own test environment they are not installed
at all), so it shows what `pip install trainkit-core trainkit-algorithms` is enough for.
"""

import json
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).parents[2] / "examples" / "core_loop.py"

RUN = """
import importlib.abc, json, runpy, sys

class OnlyCoreAndAlgorithms(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        parts = name.split(".")
        if parts[0] == "trainkit" and len(parts) > 1 and parts[1] not in ("core", "algorithms"):
            raise ModuleNotFoundError(f"{name} is hidden: only trainkit-core and "
                                      "trainkit-algorithms are installed", name=name)
        return None

sys.meta_path.insert(0, OnlyCoreAndAlgorithms())
result = runpy.run_path(sys.argv[1], run_name="example")["run"]("4ep", 0)
loaded = sorted(m for m in sys.modules if m.startswith("trainkit."))
print(json.dumps({"result": result, "loaded": loaded}))
"""


def test_the_core_only_loop_trains_with_label_smoothing_and_clipping():
    done = subprocess.run(
        [sys.executable, "-c", RUN, str(EXAMPLE)],
        capture_output=True,
        text=True,
        timeout=240,
        check=True,
    )
    report = json.loads(done.stdout.strip().splitlines()[-1])
    result = report["result"]
    assert {m.split(".")[1] for m in report["loaded"]} == {"core", "algorithms"}
    assert result["batches"] == 128  # 4 epochs of 2048 samples in batches of 64
    # Each method ran at its events on every batch.
    assert result["applied"] == {
        "LabelSmoothing at before_loss": 128,
        "LabelSmoothing at after_loss": 128,
        "GradientClipping at after_train_batch": 128,
    }
    assert result["last_loss"] < result["first_loss"] - 0.1
    assert result["accuracy"] > 0.7  # chance is 0.5
