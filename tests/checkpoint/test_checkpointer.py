"""Checkpointer: interval, rotation, autoresume, and bitwise resume after kill -9."""

import json

import pytest
import torch

from ckpt_runs import KillAt, in_child, takes_over_the_dead_run, trainer
from toy import flat_params
from trainkit.checkpoint import Checkpointer, list_checkpoints
from trainkit.core import Algorithm, Event


@pytest.fixture(autouse=True)
def one_thread():
    # Forked children run single-threaded (TESTING.md); the parent matches them so that
    # results can be compared bitwise.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def uninterrupted():
    run = trainer()
    run.fit()
    return flat_params(run.state.model)


def _names(store, folder=""):
    """The checkpoints in ``store``'s ``folder``, newest first."""
    url = f"{store.url}/{folder}" if folder else store.url
    return [str(p).rsplit("/", 1)[1] for p in list_checkpoints(url, storage_options=store.options)]


# The same tests on every kind of storage: a local folder, S3, and fsspec's local and
# in-memory file systems (the `store` fixtures in conftest.py); memory:// lives in one
# process, so the tests that fork leave it out (`shared_store`).


@pytest.mark.parametrize("async_save", [False, True])
def test_resume_after_kill_9_is_bitwise_equal(shared_store, tmp_path, async_save):
    store = shared_store
    options = dict(interval="4ba", autoresume=True, async_save=async_save,
                   storage_options=store.options, local_dir=tmp_path)  # fmt: skip

    def crashing_run():
        trainer(store.url, callbacks=[KillAt(14)], **options).fit()

    assert in_child(crashing_run) == -9
    names = _names(store)
    if async_save and names[0] != "ep1-ba12":
        # Killed while batch 12's write was still in the background: it was never
        # published, and the run resumes from the checkpoint before it.
        assert not store.objects("ep1-ba12/trainkit-manifest.json")
        names.insert(0, "ep1-ba12")
    assert names == ["ep1-ba12", "ep0-ba8", "ep0-ba4"]
    # Autoresume takes the complete checkpoint `latest` names. An async save killed after
    # publishing batch 12's manifest and before rewriting `latest` leaves it naming batch 8.
    latest = store.read("latest").decode().strip()
    assert latest == "ep1-ba12" or (async_save and latest == "ep0-ba8")

    resumed = trainer(store.url, **options)
    assert resumed.state.timestamp.batch == int(latest.rsplit("ba", 1)[1])
    with takes_over_the_dead_run():
        resumed.fit()
    assert torch.equal(flat_params(resumed.state.model), uninterrupted())
    assert store.read("latest").decode().strip() == "ep3-ba24"
    assert not [key for key in store.objects() if key.endswith(".incomplete")]  # cleared


def test_autoresume_with_an_empty_folder_starts_fresh(store):
    run = trainer(f"{store.url}/new", autoresume=True, storage_options=store.options)
    assert run.state.timestamp.batch == 0
    run.fit()
    assert store.read("new/latest") == b"ep3-ba24\n"


def test_interval_and_final_save_and_manifest(store):
    trainer(store.url, interval="1ep", max_duration="20ba", storage_options=store.options).fit()
    assert sorted(_names(store)) == ["ep1-ba8", "ep2-ba16", "ep2-ba20"]  # every epoch, and the end
    manifest = json.loads(store.read("ep2-ba20/trainkit-manifest.json"))
    assert manifest["timestamp"]["batch"] == 20
    assert manifest["world_size"] == 1
    assert set(manifest["files"]) == {".metadata", "__0_0.distcp"}
    for name, entry in manifest["files"].items():
        assert len(store.read(f"ep2-ba20/{name}")) == entry["size"]
        assert len(entry["xxh3_128"]) == 32  # the default checksum, 128 bits


def test_the_last_batch_is_saved_once_at_the_end(tmp_path):
    # "4ba" falls on batch 8, the last of the run and of its epoch: one save after the epoch
    # ended (ep1-ba8), not one of the batch (ep0-ba8) and the same state again at FIT_END.
    trainer(tmp_path, interval="4ba", max_duration="1ep").fit()
    assert [p.name for p in list_checkpoints(tmp_path)] == ["ep1-ba8", "ep0-ba4"]


class HalveAtFitEnd(Algorithm):
    """Changes the weights at FIT_END, after the last batch, as SWA puts in its average."""

    def match(self, event, state):
        return event == Event.FIT_END

    def apply(self, event, state, logger):
        with torch.no_grad():
            for param in state.model.parameters():
                param.mul_(0.5)


def test_the_final_checkpoint_holds_what_algorithms_did_at_the_end(tmp_path):
    # Batch 10 is due by the interval and ends the run: its save must come after FIT_END's
    # algorithms, or the run's final weights are in no checkpoint.
    run = trainer(tmp_path, algorithms=[HalveAtFitEnd()], interval="5ba", max_duration="10ba")
    run.fit()
    assert [p.name for p in list_checkpoints(tmp_path)] == ["ep1-ba10", "ep0-ba5"]
    loaded = trainer(tmp_path, load_path="latest", max_duration="10ba")
    assert torch.equal(flat_params(loaded.state.model), flat_params(run.state.model))


def test_keep_rotates_but_never_the_newest(store):
    trainer(store.url, interval="2ba", keep=2, max_duration="10ba",
            storage_options=store.options).fit()  # fmt: skip
    assert _names(store) == ["ep1-ba10", "ep0-ba8"]
    assert store.read("latest") == b"ep1-ba10\n"
    # Beside them, on a local folder, the Trainer's goodput ledger (docs/goodput.md).
    saved = {key.split("/")[0] for key in store.objects() if not key.startswith("goodput.")}
    assert saved == {"ep1-ba10", "ep0-ba8", "latest"}


def test_load_path_latest_and_weights_only(store):
    source = trainer(store.url, max_duration="5ba", storage_options=store.options)
    source.fit()
    finetune = trainer(store.url, load_path="latest", load_weights_only=True,
                       storage_options=store.options)  # fmt: skip
    assert torch.equal(flat_params(finetune.state.model), flat_params(source.state.model))
    assert finetune.state.timestamp.batch == 0  # only the weights came along
    assert finetune.state.optimizers[0].state == {} or all(
        s["step"] == 1 for s in finetune.state.optimizers[0].state.values()
    )


def test_callable_interval(store):
    every_third = lambda state, event: state.timestamp.batch % 3 == 0  # noqa: E731
    trainer(store.url, interval=every_third, max_duration="7ba",
            storage_options=store.options).fit()  # fmt: skip
    assert sorted(_names(store)) == ["ep0-ba3", "ep0-ba6", "ep0-ba7"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"keep": 0}, r"keep=0 is not valid; use a positive number of checkpoints, or -1"),
        ({"keep": -3}, r"keep=-3 is not valid"),
        ({"interval": "every epoch"}, r"interval 'every epoch' is not a duration; use .*'10ep'"),
        ({"interval": "0ba"}, r"interval '0ba' is zero"),
        ({"name_format": "ep{epochs}"}, r"name_format 'ep\{epochs\}' is not valid"),
    ],
)
def test_bad_arguments(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        Checkpointer(folder=tmp_path, **kwargs)
