"""The README's example runs as written."""

import re
from pathlib import Path

README = Path(__file__).parents[2] / "README.md"


def test_readme_example_trains(capsys):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert len(blocks) == 1
    namespace: dict = {}
    exec(compile(blocks[0], str(README), "exec"), namespace)
    trainer = namespace["trainer"]
    assert trainer.state.timestamp.epoch == 10
    assert trainer.state.device_train_microbatch_size is None  # never ran out of memory
    metrics = trainer.eval()
    assert metrics["metrics/eval/accuracy"] > 0.9
