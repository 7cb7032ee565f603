"""Every code block in the READMEs and docs/ works as written (issue 52).

Python blocks run (small sizes, in a fresh folder; see tests/doc_blocks.py for the
markers of the few that cannot run here); YAML blocks are trainkit run configs, validated
and built as ``trainkit train`` would; bash lines are checked without running them: each
``trainkit ...`` command must parse with the real command line, each ``pip install`` /
``uv`` line must name packages, folders and extras of this repository, each script a file
that takes the options given; TOML blocks parse; every block names its language.
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import re
import shlex
import sys
import tomllib
import types
from pathlib import Path

import pytest
import yaml

from doc_blocks import LANGUAGES, ROOT, Block, all_blocks, blocks, imports_only, undefined_names

BLOCKS = all_blocks()
# Python blocks a test of their own runs, and checks more of.
RUN_ELSEWHERE = {ROOT / "README.md": "tests/integration/test_readme.py"}


def _of(language: str) -> list[Block]:
    return [block for block in BLOCKS if block.language == language]


def _packages() -> dict[str, tuple[Path, set[str]]]:
    """Distribution name -> (its folder, its extras), for every package of the repository."""
    found = {}
    for pyproject in [
        *ROOT.glob("packages/*/pyproject.toml"),
        *ROOT.glob("examples/*/pyproject.toml"),
    ]:
        project = tomllib.loads(pyproject.read_text())["project"]
        found[project["name"]] = (pyproject.parent, set(project.get("optional-dependencies", {})))
    return found


PACKAGES = _packages()


def test_every_block_names_its_language():
    unlabelled = [
        f"{b.id} ({b.language or 'no language'})" for b in BLOCKS if b.language not in LANGUAGES
    ]
    assert not unlabelled, f"label these blocks with one of {LANGUAGES}: {unlabelled}"


def test_the_documents_hold_blocks_of_every_kind():
    assert {block.language for block in BLOCKS} == set(LANGUAGES)
    assert len(_of("python")) > 20


# --- python ---------------------------------------------------------------------------------


@pytest.mark.parametrize("block", _of("python"), ids=lambda b: b.id)
def test_python_block(block, tmp_path, monkeypatch):
    code = compile(block.code, block.id, "exec")
    if block.path in RUN_ELSEWHERE:
        assert block.path.name in (ROOT / RUN_ELSEWHERE[block.path]).read_text()
        return
    if block.marker == "compile-only":
        assert block.reason, f"{block.id}: say why the block cannot run here"
        assert not undefined_names(block.code), f"{block.id} reads undefined names"
        exec(compile(imports_only(block.code), block.id, "exec"), {})
        return
    monkeypatch.chdir(tmp_path)
    module = types.ModuleType("doc_block")  # a real module: dataclasses look their class up
    monkeypatch.setitem(sys.modules, module.__name__, module)
    try:
        exec(code, module.__dict__)
    finally:  # a block run as a script ends its process, and with it a group it started
        import torch.distributed

        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


# --- yaml: trainkit run configs -------------------------------------------------------------


@pytest.mark.parametrize("block", _of("yaml"), ids=lambda b: b.id)
def test_yaml_block_is_a_valid_run_config(block, tmp_path, monkeypatch):
    from trainkit.cli._build import build_run
    from trainkit.cli._config import load_config

    monkeypatch.chdir(tmp_path)
    assert isinstance(yaml.safe_load(block.code), dict)
    path = tmp_path / "config.yaml"
    path.write_text(block.code)
    run = build_run(load_config(path))
    assert run.config.model is not None


# --- toml -----------------------------------------------------------------------------------


@pytest.mark.parametrize("block", _of("toml"), ids=lambda b: b.id)
def test_toml_block_parses(block):
    assert tomllib.loads(block.code)


# --- bash -----------------------------------------------------------------------------------


class _Parsed(Exception):
    """Raised by the patched argparse once a command line has parsed, so nothing runs."""

    def __init__(self, namespace: argparse.Namespace) -> None:
        self.namespace = namespace


def _parse_only(monkeypatch):
    parse_args = argparse.ArgumentParser.parse_args

    def parse(self, args=None, namespace=None):
        raise _Parsed(parse_args(self, args, namespace))

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse)


def _check_trainkit(argv: list[str], where: str) -> None:
    from trainkit.cli._main import main

    try:
        main(argv)
    except _Parsed as parsed:
        namespace = parsed.namespace
    except SystemExit as exit_:
        raise AssertionError(f"{where}: `trainkit {shlex.join(argv)}` does not parse") from exit_
    else:
        raise AssertionError(f"{where}: `trainkit {shlex.join(argv)}` parsed nothing")
    if getattr(namespace, "command", None) == "launch" and namespace.target == "train":
        _check_trainkit(["train", *namespace.args], where)


def _check_requirement(text: str, where: str) -> None:
    """One ``pip install`` / ``uv add`` argument: a folder of this repository (with extras),
    a ``name @ git+...#subdirectory=folder``, or a package name."""
    name, _, url = (part.strip() for part in text.partition(" @ "))
    if url:
        assert url.startswith("git+$REPO"), f"{where}: {text!r}: use git+$REPO"
        folder = ROOT / url.split("#subdirectory=", 1)[1]
        base, extras = _split_extras(name)
        assert PACKAGES.get(base, (None,))[0] == folder, f"{where}: {text!r}: no {base} there"
        assert extras <= PACKAGES[base][1], f"{where}: {text!r}: unknown extras"
        return
    base, extras = _split_extras(name)
    if base.startswith(("./", "../trainkit/")):
        folder = ROOT / base.removeprefix("../trainkit/")
        named = [n for n, (path, _) in PACKAGES.items() if path == folder.resolve()]
        assert named, f"{where}: {text!r}: no package folder {folder}"
        assert extras <= PACKAGES[named[0]][1], f"{where}: {text!r}: unknown extras"
    elif base.startswith("trainkit"):
        raise AssertionError(
            f"{where}: {text!r} is not on PyPI yet; install ./packages/<name> from a clone, or "
            "'<name> @ git+$REPO#subdirectory=packages/<name>' (a comment may say the name "
            "for once it is published)"
        )


def _split_extras(name: str) -> tuple[str, set[str]]:
    match = re.fullmatch(r"(.*?)(?:\[([\w,-]+)\])?", name)
    assert match
    return match.group(1), set(filter(None, (match.group(2) or "").split(",")))


def _check_script(words: list[str], where: str) -> None:
    """``python path.py --opt ...`` / ``python -m module`` / ``bash path.sh``."""
    if words[0] == "-m":
        assert importlib.util.find_spec(words[1]), f"{where}: no module {words[1]}"
        return
    script = ROOT / words[0]
    if words[0].split("/")[0] not in {p.name for p in ROOT.iterdir()}:
        return  # the reader's own script (train.py)
    assert script.is_file(), f"{where}: no file {words[0]}"
    source = script.read_text()
    # A script may build on a sibling's options (throughput_diagnostics on gpu_throughput).
    for sibling in script.parent.glob("*.py"):
        if sibling != script and f'"{sibling.name}"' in source:
            source += sibling.read_text()
    for option in (w.split("=")[0] for w in words[1:] if w.startswith("--")):
        assert f'"{option}"' in source, f"{where}: {words[0]} takes no {option}"


NOT_CHECKED = {"git", "cd", "torchrun", "pytest"}  # not ours, or the test runner itself


def _check_line(words: list[str], where: str) -> None:
    while words and re.fullmatch(r"[A-Za-z_]\w*=\S*", words[0]):
        words = words[1:]  # environment assignments
    if words[:2] == ["uv", "run"]:
        words = words[2:]
    if words[:1] == ["srun"]:  # SLURM: the command after srun's options (written --opt=value)
        words = list(itertools.dropwhile(lambda word: word.startswith("-"), words[1:]))
    if not words or words[0] in NOT_CHECKED or words[:2] == ["uv", "sync"]:
        return
    if words[0] == "trainkit":
        _check_trainkit(words[1:], where)
    elif words[:2] == ["pip", "install"] or words[:3] == ["uv", "pip", "install"]:
        for argument in words[words.index("install") + 1 :]:
            _check_requirement(argument, where)
    elif words[:2] == ["uv", "add"]:
        for argument in words[2:]:
            _check_requirement(argument, where)
    elif words[0] in ("python", "bash"):
        _check_script(words[1:], where)
    elif words[0].endswith(".sh"):
        _check_script(words, where)
    else:
        raise AssertionError(f"{where}: no check for `{shlex.join(words)}`; add one")


def _lines(code: str) -> list[tuple[int, list[str]]]:
    """Each command of a bash block (continuations joined, comments left out)."""
    commands, pending, first = [], "", 0
    for number, line in enumerate(code.splitlines()):
        if not pending:
            first = number
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1]  # as bash joins them: nothing between
            continue
        words = shlex.split(pending + line, comments=True)
        pending = ""
        if words:
            commands.append((first, words))
    return commands


@pytest.mark.parametrize("block", _of("bash"), ids=lambda b: b.id)
def test_bash_block_commands_exist(block, monkeypatch):
    _parse_only(monkeypatch)
    for offset, words in _lines(block.code):
        _check_line(words, f"{block.path.relative_to(ROOT)}:{block.line + 1 + offset}")
    # Packages named in comments too (the names once published).
    for name, extras in re.findall(r"\b(trainkit-[a-z-]+)(?:\[([\w,-]+)\])?", block.code):
        assert name in PACKAGES, f"{block.id}: no package {name}"
        assert set(filter(None, extras.split(","))) <= PACKAGES[name][1], (block.id, name, extras)


def test_every_readme_says_how_to_install_from_a_clone_and_from_git():
    for readme in [ROOT / "README.md", *sorted(ROOT.glob("packages/*/README.md"))]:
        commands = "".join(b.code for b in blocks(readme) if b.language == "bash")
        assert "pip install ./packages/core" in commands, readme
        assert "@ git+$REPO#subdirectory=packages/" in commands, readme


def test_the_bash_checks_catch_what_they_check(monkeypatch):
    _parse_only(monkeypatch)
    _check_line(["trainkit", "train", "c.yaml", "--run-dir", "x"], "ok")
    for words in [
        ["trainkit", "train", "--no-such-option"],
        ["trainkit", "launch", "-n", "2", "train", "--no-such-option"],
        ["trainkit", "checkpoint", "export", "p", "--format", "pdf"],
        ["pip", "install", "./packages/nowhere"],
        ["pip", "install", "trainkit-loggers"],  # not published yet
        ["pip", "install", "./packages/loggers[nope]"],
        ["pip", "install", "trainkit-core @ git+$REPO#subdirectory=packages/trainer"],
        ["python", "bench/step_time.py", "--no-such-option"],
    ]:
        with pytest.raises((AssertionError, SystemExit)):
            _check_line(words, "bad")
