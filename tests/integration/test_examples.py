"""The example scripts run as a user runs them, in a fresh interpreter."""

import re
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_train_mlp_reaches_good_accuracy_in_a_few_epochs():
    script = EXAMPLES / "train_mlp.py"
    result = subprocess.run(
        [sys.executable, str(script), "--epochs", "5", "--device", "cpu", "--seed", "0"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    match = re.search(r"final eval accuracy: ([0-9.]+)", result.stdout)
    assert match, f"no final accuracy line in the output:\n{result.stdout}"
    assert float(match.group(1)) > 0.85, result.stdout  # chance is 1/3
