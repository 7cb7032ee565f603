"""The generated lists in docs/ match the code (events, groups, fields, members, components)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_generated_docs_are_current():
    result = subprocess.run(
        [sys.executable, str(ROOT / "docs" / "generate.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def test_every_event_and_group_is_on_the_architecture_page():
    from trainkit.core import Event, TrainerConfig, plugins
    from trainkit.core.config import settings, slots

    text = (ROOT / "docs" / "architecture.md").read_text()
    assert all(f"`{event.name}`" in text for event in Event)
    assert all(f"`{group}`" in text for group in plugins.GROUPS)
    assert all(f"`{f.name}`" in text for f in [*settings(TrainerConfig), *slots(TrainerConfig)])
