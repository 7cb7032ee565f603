"""Shared test set-up.

Multi-rank tests fork ranks from this process (see tests/multirank.py): the heavy torch
modules are imported here, once, after collection and before any test forks, so each rank
starts in ~0.1 s.

CUDA is hidden (``CUDA_VISIBLE_DEVICES=""``) before torch is imported, unless this is a GPU
run: ``uv run pytest -m gpu``, or ``TRAINKIT_TEST_GPU=1``. A forked child cannot use CUDA,
and once the parent has run a backward with a GPU visible, autograd's device threads make
every forked backward fail; hidden, the CPU tests run the same with or without a GPU.
A GPU run runs only the tests marked ``gpu``; elsewhere they are skipped. docs/testing.md.

``TRAINKIT_PACKAGE_TESTS=own-envs`` (set by .ci/run, which runs each package's tests in an
environment of its own, .ci/package-envs) leaves ``tests/<package>/`` out, so every test
runs once in CI: this run then holds the tests that combine packages.
"""

import os
import shlex
import sys

GPU_ENV = "TRAINKIT_TEST_GPU"
PACKAGE_TESTS_ENV = "TRAINKIT_PACKAGE_TESTS"
_TESTS = os.path.dirname(os.path.abspath(__file__))
_PACKAGES = os.path.join(os.path.dirname(_TESTS), "packages")


def _marker_expression(args: list[str]) -> str | None:
    """The ``-m`` expression among pytest's arguments (the last one wins, as in pytest)."""
    expression = None
    for i, arg in enumerate(args):
        if arg in ("-m", "--markexpr") and i + 1 < len(args):
            expression = args[i + 1]
        elif arg.startswith("--markexpr="):
            expression = arg.partition("=")[2]
        elif arg.startswith("-m") and not arg.startswith("--"):
            expression = arg[2:]
    return expression


_args = [*shlex.split(os.environ.get("PYTEST_ADDOPTS", "")), *sys.argv[1:]]
GPU_RUN = os.environ.get(GPU_ENV) == "1" or (_marker_expression(_args) or "").strip() == "gpu"
if GPU_RUN:
    os.environ[GPU_ENV] = "1"  # pytest-xdist workers inherit the decision
else:
    os.environ["CUDA_VISIBLE_DEVICES"] = ""  # before torch initialises CUDA; children inherit

import pytest  # noqa: E402


def _import_for_forks() -> None:
    # Where tests run (a pytest-xdist worker, or pytest without -n), after collection and
    # before the first test: the modules forked ranks use, so each starts in ~0.1 s. An
    # xdist controller runs no test and so never imports torch (~3 s saved per run).
    import torch._dynamo
    import torch.distributed.checkpoint
    import torch.distributed.fsdp
    import torch.distributed.tensor.parallel

    # One backward before any test. Autograd's engine decides once, at its first backward,
    # whether to start device threads, after which every forked child's backward fails
    # ("Unable to handle autograd's threading..."). It starts them if a non-CPU device counts
    # then, and with CUDA hidden AOTAutograd's tracing still makes one count: a worker whose
    # first backward came inside a torch.compile or an ONNX export failed every later
    # multi-rank test. Decided here, with nothing counted, the engine never starts them.
    # (A GPU run counts CUDA and forks nothing.)
    if not GPU_RUN:
        torch.ones((), requires_grad=True).backward()


def _package_tests_elsewhere() -> bool:
    value = os.environ.get(PACKAGE_TESTS_ENV, "")
    if value not in ("", "own-envs"):
        raise pytest.UsageError(
            f"{PACKAGE_TESTS_ENV}={value!r} is not understood; set it to 'own-envs' (the "
            "packages' tests run in their own environments) or leave it unset (run them here)"
        )
    return value == "own-envs"


def pytest_ignore_collect(collection_path, config):
    """In CI, ``tests/<package>/`` run in the package's own environment instead."""
    if not _package_tests_elsewhere():
        return None
    parent, name = os.path.split(str(collection_path))
    if parent == _TESTS and os.path.isdir(os.path.join(_PACKAGES, name)):
        return True
    return None


def pytest_report_header(config):
    if _package_tests_elsewhere():
        return (
            f"{PACKAGE_TESTS_ENV}=own-envs: tests/<package>/ run in their own environments "
            "(.ci/package-envs); this run holds tests/integration/ and tests/*.py"
        )
    return None


def pytest_collection_modifyitems(config, items):
    import torch

    _import_for_forks()
    gpu_tests = [item for item in items if item.get_closest_marker("gpu")]
    if GPU_RUN:
        skip_cpu = pytest.mark.skip(
            reason="a GPU run (-m gpu / TRAINKIT_TEST_GPU=1) runs only `gpu` tests: CPU tests "
            "fork, which CUDA forbids; run them in a separate `uv run pytest`"
        )
        for item in items:
            if not item.get_closest_marker("gpu"):
                item.add_marker(skip_cpu)
    if gpu_tests and not torch.cuda.is_available():
        reason = "needs a CUDA device"
        if not GPU_RUN:
            reason += " (hidden from CPU runs: run GPU tests with `uv run pytest -m gpu`)"
        for item in gpu_tests:
            item.add_marker(pytest.mark.skip(reason=reason))
