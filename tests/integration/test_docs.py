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
    from trainkit.core import Event, plugins
    from trainkit.core.config import settings, slots
    from trainkit.trainer import TrainerConfig

    text = (ROOT / "docs" / "architecture.md").read_text()
    assert all(f"`{event.name}`" in text for event in Event)
    assert all(f"`{group}`" in text for group in plugins.GROUPS)
    assert all(f"`{f.name}`" in text for f in [*settings(TrainerConfig), *slots(TrainerConfig)])


def test_every_package_is_in_the_layering_table_and_the_readme():
    import tomllib

    architecture = (ROOT / "docs" / "architecture.md").read_text()
    readme = (ROOT / "README.md").read_text()
    for pyproject in sorted(ROOT.glob("packages/*/pyproject.toml")):
        folder = pyproject.parent.name
        name = tomllib.loads(pyproject.read_text())["project"]["name"]
        assert name == f"trainkit-{folder}"
        assert f"| {name} | `trainkit.{folder}` |" in architecture, name
        assert f"| [`{name}`](packages/{folder}/README.md) | `trainkit.{folder}` |" in readme, name


def test_coming_from_composer_names_real_fields_and_files():
    import dataclasses
    import re

    from trainkit.trainer import TrainerConfig

    text = (ROOT / "docs" / "coming-from-composer.md").read_text()
    fields = {f.name for f in dataclasses.fields(TrainerConfig)}
    same = text.split("Same name, same meaning:", 1)[1].split("\n\n", 1)[0]
    named = re.findall(r"`(\w+)`", same)
    assert len(named) > 30 and set(named) <= fields, set(named) - fields
    # The trainkit column of the renames table: `field=...` must be a Trainer field.
    for _composer, trainkit in re.findall(r"^\| `(\w+)[=(`].*?\| `(\w+)=", text, re.MULTILINE):
        assert trainkit in fields or trainkit[0].isupper() or trainkit in ("dist",), trainkit
    for example in re.findall(r"`(examples/[\w.]+)`", text):
        assert (ROOT / example).is_file(), example
