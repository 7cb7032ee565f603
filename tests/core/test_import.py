"""`import trainkit.core` is cheap and has no side effects beyond those of `import torch`.

One fresh interpreter imports torch, takes a snapshot, imports trainkit.core and reports
what changed: the difference is what trainkit.core itself adds. (This process cannot be
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
import trainkit.core  # noqa: E402
after = snapshot()
print(json.dumps({"before": before, "after": after, "entry_points": entry_point_calls}))
"""


def test_import_trainkit_core_has_no_side_effects():
    result = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    before, after = report["before"], report["after"]

    added = sorted(set(after["modules"]) - set(before["modules"]))
    not_ours = [m for m in added if m != "trainkit" and not m.startswith("trainkit.")]
    assert not not_ours, f"import trainkit.core imports more than torch does: {not_ours}"
    heavy = [m for m in HEAVY if m in after["modules"]]
    assert not heavy, f"heavy modules present after import trainkit.core: {heavy}"

    new_env = {k: v for k, v in after["environ"].items() if before["environ"].get(k) != v}
    assert not new_env, f"import trainkit.core set environment variables: {new_env}"
    assert after["environ"].keys() == before["environ"].keys()

    assert after["handlers"] == before["handlers"], "import trainkit.core added log handlers"
    assert after["root_level"] == before["root_level"]
    assert after["warning_filters"] == before["warning_filters"], "warning filters changed"
    assert after["torch"] == before["torch"], "torch global settings changed"
    assert report["entry_points"] == [], f"entry points touched: {report['entry_points']}"
