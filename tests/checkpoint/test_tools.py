"""inspect / verify / export, as functions and as `trainkit checkpoint ...` (`main(argv)`)."""

import json
import os
import pickle
import runpy
import sys

import pytest
import torch
from safetensors.torch import load_file
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from multirank import run_ranks
from trainkit.checkpoint import CheckpointError, export_checkpoint, save_checkpoint
from trainkit.checkpoint._cli import main
from trainkit.checkpoint._manifest import hash_file


def _save_sharded(rank, world, folder, make):
    run = make(world)
    run.fit()
    save_checkpoint(run.state, folder)
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_model_state_dict(run.state.model, options=options)  # full on rank 0 only


@pytest.fixture(scope="module")
def sharded(tmp_path_factory, sharded_trainer):
    """A checkpoint saved FSDP2-sharded on 2 ranks, and the full model weights it holds."""
    folder = tmp_path_factory.mktemp("tools") / "run" / "ep0-ba3"
    weights = run_ranks(_save_sharded, 2, folder, sharded_trainer)[0]
    return folder, weights


def _run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_inspect_shows_time_layout_files_and_model(sharded, capsys):
    folder, weights = sharded
    code, out, _ = _run(capsys, "inspect", str(folder.parent))  # via its latest file
    assert code == 0
    assert f"checkpoint   {folder}" in out
    assert "epoch 0, batch 3, sample" in out
    assert "world size   2 (strategy=Shard)" in out
    for name in (".metadata", "__0_0.distcp", "__1_0.distcp"):
        assert name in out
    assert "module.0.weight  (24, 8)" in out and "float32" in out
    # The top-level entries of the saved state, in order (which there are is core's State).
    keys = next(line for line in out.splitlines() if line.startswith("keys ")).split()[1:]
    assert [k.rstrip(",") for k in keys] == sorted(k.rstrip(",") for k in keys)
    assert {"model,", "optimizers,", "rng,", "run_name,"} <= set(keys)

    code, out, _ = _run(capsys, "inspect", str(folder), "--json")
    info = json.loads(out)
    assert code == 0 and info["world_size"] == 2 and info["timestamp"]["batch"] == 3
    assert info["total_size"] == sum(info["files"].values())
    assert info["files"]["__1_0.distcp"] == (folder / "__1_0.distcp").stat().st_size
    assert info["model"] == {
        name: {"shape": list(t.shape), "dtype": "float32"} for name, t in weights.items()
    }
    assert info["model_numel"] == sum(t.numel() for t in weights.values())


def test_export_gives_full_weights_loadable_without_trainkit(sharded, tmp_path, capsys):
    folder, weights = sharded
    out = tmp_path / "model.safetensors"
    code, printed, _ = _run(capsys, "export", str(folder), str(out))
    assert code == 0 and f"wrote {out}: 4 tensors" in printed
    exported = load_file(out)
    assert exported.keys() == weights.keys()
    for name, tensor in weights.items():
        assert torch.equal(exported[name], tensor), name


def test_verify_passes_then_names_the_corrupted_file(sharded, tmp_path, capsys):
    folder, _ = sharded
    code, out, _ = _run(capsys, "verify", str(folder))
    assert code == 0 and "ok:" in out and "3 files match" in out

    copy = tmp_path / "copy"
    copy.mkdir()
    for file in folder.iterdir():
        (copy / file.name).write_bytes(file.read_bytes())
    data = bytearray((copy / "__1_0.distcp").read_bytes())
    data[100] ^= 0xFF
    (copy / "__1_0.distcp").write_bytes(bytes(data))
    code, out, err = _run(capsys, "verify", str(copy))
    assert code == 1 and out == ""
    assert "trainkit checkpoint verify: checkpoint file" in err
    assert "__1_0.distcp does not match its xxh3_128" in err
    with pytest.raises(CheckpointError, match=r"__1_0\.distcp does not match"):
        export_checkpoint(copy, tmp_path / "never.safetensors")
    assert not (tmp_path / "never.safetensors").exists()


def test_bad_paths_and_usage(tmp_path, capsys):
    code, _, err = _run(capsys, "inspect", str(tmp_path / "nowhere"))
    assert code == 1 and "nowhere does not exist" in err
    code, _, err = _run(capsys, "verify", str(tmp_path))
    assert code == 1 and "is not a checkpoint: it has no trainkit-manifest.json" in err
    code, _, err = _run(capsys, "export", str(tmp_path), str(tmp_path / "x.safetensors"))
    assert code == 1 and "is not a checkpoint" in err
    code, _, err = _run(capsys, "inspect", "s3://", "-o", "endpoint_url")
    assert code == 1 and "storage option 'endpoint_url' is not KEY=VALUE" in err
    code, _, err = _run(capsys, "frobnicate")
    assert code == 2 and "invalid choice: 'frobnicate'" in err
    code, _, err = _run(capsys)
    assert code == 2 and "COMMAND" in err


class CreatesFile:
    def __init__(self, target):
        self.target = target

    def __reduce__(self):
        return (os.system, (f"touch {self.target}",))


def test_tools_never_run_code_from_a_checkpoint(sharded, tmp_path, capsys):
    folder, _ = sharded
    evil, marker = tmp_path / "evil", tmp_path / "pwned"
    evil.mkdir()
    for file in folder.iterdir():
        (evil / file.name).write_bytes(file.read_bytes())
    (evil / ".metadata").write_bytes(pickle.dumps(CreatesFile(marker)))
    manifest = json.loads((evil / "trainkit-manifest.json").read_text())
    manifest["files"][".metadata"] = {
        "size": (evil / ".metadata").stat().st_size,
        "sha256": hash_file(evil / ".metadata"),
    }
    (evil / "trainkit-manifest.json").write_text(json.dumps(manifest))
    for command in (["inspect", str(evil)], ["verify", str(evil)],
                    ["export", str(evil), str(tmp_path / "x.safetensors")]):  # fmt: skip
        code, _, err = _run(capsys, *command)
        assert code == 1 and "posix.system, which is not checkpoint metadata" in err
    assert not marker.exists()


def test_python_dash_m_runs_the_same_command(sharded, monkeypatch, capsys):
    folder, _ = sharded
    monkeypatch.setattr(sys, "argv", ["python -m trainkit.checkpoint", "verify", str(folder)])
    with pytest.raises(SystemExit) as exited:
        runpy.run_module("trainkit.checkpoint", run_name="__main__")
    assert exited.value.code == 0 and "ok:" in capsys.readouterr().out
