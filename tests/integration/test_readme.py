"""The README's example runs as written (its other blocks: tests/integration/test_doc_blocks.py)."""

from doc_blocks import ROOT, blocks


def test_readme_example_trains(capsys):
    readme = ROOT / "README.md"
    python = [block for block in blocks(readme) if block.language == "python"]
    assert len(python) == 1
    namespace: dict = {}
    exec(compile(python[0].code, str(readme), "exec"), namespace)
    trainer = namespace["trainer"]
    assert trainer.state.timestamp.epoch == 10
    assert trainer.state.device_train_microbatch_size is None  # never ran out of memory
    metrics = trainer.eval()
    assert metrics["metrics/eval/accuracy"] > 0.9
