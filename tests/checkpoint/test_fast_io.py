"""The fast paths keep the results exact: checksums taken while writing, tensors read
straight into the state, host buffers reused by asynchronous saves, abandoned saves."""

import json
import threading
import warnings

import pytest
import torch
from torch import nn

from ckpt_runs import abandon_while_writing, trainer
from toy import flat_params
from trainkit.checkpoint import (
    Checkpointer,
    SaveAbandoned,
    _save,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
    verify_checkpoint,
)
from trainkit.checkpoint._common import single_process_is_intended
from trainkit.checkpoint._manifest import hash_file
from trainkit.checkpoint._save import save_to
from trainkit.checkpoint._storage import LocalStorage
from trainkit.checkpoint._write import Cancel
from trainkit.core import State


@pytest.mark.parametrize("checksum", ["sha256", "xxh3_128"])
def test_checksums_taken_while_writing_match_the_files(tmp_path, checksum):
    run = trainer(max_duration="2ba")
    run.fit()
    save_checkpoint(run.state, tmp_path / "ckpt", checksum=checksum).wait()
    manifest = json.loads((tmp_path / "ckpt" / "trainkit-manifest.json").read_text())
    for name, entry in manifest["files"].items():
        assert set(entry) == {"size", checksum}
        assert entry[checksum] == hash_file(tmp_path / "ckpt" / name, checksum)
        assert entry["size"] == (tmp_path / "ckpt" / name).stat().st_size
    assert verify_checkpoint(tmp_path / "ckpt").files[".metadata"].algorithm == checksum
    fresh = trainer()
    load_checkpoint(fresh.state, tmp_path / "ckpt")
    assert torch.equal(flat_params(fresh.state.model), flat_params(run.state.model))


class Odd(nn.Module):
    """Parameters the direct read must handle: bf16, fp16, a transposed (non-contiguous)
    one, a view into a larger tensor, an empty one, and a buffer."""

    def __init__(self, seed):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.bf16 = nn.Parameter(torch.randn(64, 33, generator=g).to(torch.bfloat16))
        self.fp16 = nn.Parameter(torch.randn(7, generator=g).half())
        self.transposed = nn.Parameter(torch.randn(5, 9, generator=g).t())
        self.view = nn.Parameter(torch.randn(20, generator=g)[4:12])
        self.empty = nn.Parameter(torch.empty(0, 3))
        self.register_buffer("steps", torch.arange(6) * (seed + 1))


def _odd_state(seed):
    return State(model=Odd(seed), optimizers=[])


def test_tensors_of_every_layout_load_exactly(tmp_path):
    saved = _odd_state(1)
    assert not saved.model.transposed.is_contiguous()
    save_checkpoint(saved, tmp_path / "ckpt").wait()
    loaded = _odd_state(2)
    load_checkpoint(loaded, tmp_path / "ckpt")
    for (name, a), (_, b) in zip(
        saved.model.state_dict().items(), loaded.model.state_dict().items(), strict=True
    ):
        assert a.dtype == b.dtype and torch.equal(a, b), name


def test_async_saves_of_one_state_never_tear_each_other(tmp_path):
    run = trainer(max_duration="2ba")
    run.fit()
    first = save_checkpoint(run.state, tmp_path / "first", async_save=True)
    before = flat_params(run.state.model).clone()
    with torch.no_grad():
        for p in run.state.model.parameters():
            p.add_(1.0)  # training goes on while the first is written
    # The second save reuses the first's host buffers: it waits for the first's write.
    second = save_checkpoint(run.state, tmp_path / "second", async_save=True)
    first.wait(), second.wait()
    for name, expected in (("first", before), ("second", flat_params(run.state.model))):
        fresh = trainer()
        load_checkpoint(fresh.state, tmp_path / name)
        assert torch.equal(flat_params(fresh.state.model), expected), name


def test_where_a_stager_stages_once_each_async_save_gets_a_fresh_one(tmp_path, monkeypatch):
    # torch 2.11's DefaultStager empties its copier after one stage; the next one failed
    # with KeyError: <class 'type'> before each save got its own stager there.
    monkeypatch.setattr(_save, "stager_is_reusable", lambda: False)
    run = trainer(max_duration="2ba")
    run.fit()
    save_checkpoint(run.state, tmp_path / "first", async_save=True).wait()
    first_stager = _save._staging[run.state].stager
    with torch.no_grad():
        for p in run.state.model.parameters():
            p.add_(1.0)
    save_checkpoint(run.state, tmp_path / "second", async_save=True).wait()
    assert _save._staging[run.state].stager is not first_stager
    fresh = trainer()
    load_checkpoint(fresh.state, tmp_path / "second")
    assert torch.equal(flat_params(fresh.state.model), flat_params(run.state.model))


class StagesOnce:
    """A stager that, like torch 2.11's, closes its copier at the end of each stage."""

    def __init__(self, options):
        self.closed = False

    def stage(self, state_dict):
        if self.closed:
            raise KeyError(type)
        self.closed = "stage closes" in self.behaviour
        return state_dict

    def close(self):
        self.closed = True

    behaviour = "stage closes"


class StagesAgain(StagesOnce):
    behaviour = "stage keeps it open"


@pytest.mark.parametrize(("stager", "reusable"), [(StagesOnce, False), (StagesAgain, True)])
def test_the_reuse_probe_tells_whether_a_stager_stages_twice(monkeypatch, stager, reusable):
    monkeypatch.setattr(_save, "DefaultStager", stager)
    _save.stager_is_reusable.cache_clear()
    try:
        assert _save.stager_is_reusable() is reusable
    finally:
        _save.stager_is_reusable.cache_clear()


@pytest.mark.parametrize("async_save", [False, True])
def test_an_abandoned_save_publishes_nothing(tmp_path, async_save):
    run = trainer(tmp_path, max_duration="2ba")
    run.fit()
    cancel = Cancel()
    cancel.set("grace period over")
    with pytest.raises(
        SaveAbandoned, match=r"abandoned \(grace period over\); nothing was published"
    ) as caught:
        save_to(
            LocalStorage(tmp_path), "ep9-ba9", run.state, async_save=async_save, cancel=cancel
        ).wait()
    # DCP's finished frames keep no locals (among them the BytesIO views it wrote from): on
    # CPython 3.12.1 the garbage collector crashed on them (python/cpython#111049).
    assert _dcp_frames_with_locals(caught.value) == []
    assert (tmp_path / "latest").read_text() == "ep0-ba2\n"
    assert [p.name for p in list_checkpoints(tmp_path)] == ["ep0-ba2"]
    resumed = trainer(tmp_path, autoresume=True)
    assert resumed.state.timestamp.batch == 2


@pytest.mark.parametrize("async_save", [False, True])
def test_checkpointer_abandon_gives_up_the_save_in_flight(tmp_path, monkeypatch, async_save):
    checkpointer = Checkpointer(folder=tmp_path, interval="2ba", async_save=async_save)
    abandon_while_writing(monkeypatch, checkpointer)
    run = trainer(max_duration="4ba", callbacks=[checkpointer])
    with pytest.raises(Exception, match=r"ep0-ba4.* was abandoned \(preempted\)"):
        run.fit()
    assert [p.name for p in list_checkpoints(tmp_path)] == ["ep0-ba2"]
    assert (tmp_path / "latest").read_text() == "ep0-ba2\n"


def test_dcps_single_process_warning_is_filtered_also_in_its_background_thread():
    # An async save's write goes on in DCP's thread after save_checkpoint has returned, so
    # a context-local filter cannot cover it (whether it does depends on timing).
    message = "torch.distributed is disabled, unavailable or uninitialized, assuming ..."

    def warn_from_a_thread():
        thread = threading.Thread(target=lambda: warnings.warn(message, stacklevel=1))
        thread.start(), thread.join()
        warnings.warn("another warning", stacklevel=1)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with single_process_is_intended(background=True):
            pass
        warn_from_a_thread()
    assert [str(w.message) for w in caught] == ["another warning"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with single_process_is_intended():  # a synchronous call: filtered inside only
            pass
        warn_from_a_thread()
    assert [str(w.message) for w in caught] == [message, "another warning"]


def _dcp_frames_with_locals(error):
    found, pending, seen = [], [error], set()
    while pending:
        error = pending.pop()
        if error is None or id(error) in seen:
            continue
        seen.add(id(error))
        tb = error.__traceback__
        while tb is not None:
            code = tb.tb_frame.f_code
            if "torch/distributed/checkpoint" in code.co_filename and tb.tb_frame.f_locals:
                found.append(code.co_name)
            tb = tb.tb_next
        pending += [error.__cause__, error.__context__]
    return found
