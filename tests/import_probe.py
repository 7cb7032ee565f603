"""What importing a trainkit package adds to a fresh interpreter beyond ``import torch``.

One fresh interpreter imports torch, takes a snapshot, imports the package and reports what
changed: the difference is what the package itself adds. (A test's own process cannot be
used: conftest.py has already imported the heavy torch modules.)
"""

import json
import subprocess
import sys

HEAVY = (
    "transformers",
    "torchvision",
    "wandb",
    "boto3",
    "pydantic",
    "yaml",
    "torch.distributed.fsdp",
    "torch.distributed.checkpoint",
    "torch._dynamo",
)

_PROBE = r"""
import importlib.metadata as md
import importlib
import json
import logging
import os
import sys
import warnings

import torch


def handlers():
    loggers = {"<root>": logging.getLogger()}
    loggers.update(
        (name, obj)
        for name, obj in logging.Logger.manager.loggerDict.items()
        if isinstance(obj, logging.Logger)
    )
    return {name: [repr(h) for h in obj.handlers] for name, obj in loggers.items() if obj.handlers}


def snapshot():
    return {
        "modules": sorted(sys.modules),
        "environ": dict(os.environ),
        "handlers": handlers(),
        "root_level": logging.getLogger().level,
        "warning_filters": [repr(f) for f in warnings.filters],
        "torch": [
            str(torch.get_default_dtype()),
            torch.get_num_threads(),
            torch.is_grad_enabled(),
            torch.are_deterministic_algorithms_enabled(),
        ],
    }


entry_point_calls = []
entry_points, load = md.entry_points, md.EntryPoint.load


def recording_entry_points(*args, **kwargs):
    entry_point_calls.append(f"entry_points({args}, {kwargs})")
    return entry_points(*args, **kwargs)


def recording_load(self):
    entry_point_calls.append(f"load({self.group}:{self.name})")
    return load(self)


md.entry_points, md.EntryPoint.load = recording_entry_points, recording_load
before = snapshot()
importlib.import_module(sys.argv[1])
after = snapshot()
print(json.dumps({"before": before, "after": after, "entry_points": entry_point_calls}))
"""


def import_report(module: str) -> dict:
    """``{"before": ..., "after": ..., "entry_points": [...]}`` around ``import module``."""
    result = subprocess.run(
        [sys.executable, "-c", _PROBE, module], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def assert_no_side_effects(module: str) -> None:
    """``import module`` loads no third-party module beyond torch and changes no global."""
    report = import_report(module)
    before, after = report["before"], report["after"]

    added = sorted(set(after["modules"]) - set(before["modules"]))
    not_ours = [m for m in added if m != "trainkit" and not m.startswith("trainkit.")]
    assert not not_ours, f"import {module} imports more than torch does: {not_ours}"
    heavy = [m for m in HEAVY if m in after["modules"]]
    assert not heavy, f"heavy modules present after import {module}: {heavy}"

    new_env = {k: v for k, v in after["environ"].items() if before["environ"].get(k) != v}
    assert not new_env, f"import {module} set environment variables: {new_env}"
    assert after["environ"].keys() == before["environ"].keys()

    assert after["handlers"] == before["handlers"], f"import {module} added log handlers"
    assert after["root_level"] == before["root_level"]
    assert after["warning_filters"] == before["warning_filters"], "warning filters changed"
    assert after["torch"] == before["torch"], "torch global settings changed"
    assert report["entry_points"] == [], f"entry points touched: {report['entry_points']}"
