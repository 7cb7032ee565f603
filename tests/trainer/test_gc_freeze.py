"""``gc_freeze``: garbage collected once before the first batch, the heap frozen during the
fit (so collections during training skip the objects made before it), unfrozen after. On
CPU, and its default on CUDA (the `gpu` test)."""

import gc
import weakref

import pytest

from toy import blobs, loader, mlp
from trainkit.core import Callback
from trainkit.trainer import Trainer, _gc


class Cycle:
    """Garbage only the cycle collector can free (it refers to itself)."""

    def __init__(self):
        self.me = self


class HeapWatch(Callback):
    """What the garbage collector looks like at each batch."""

    def __init__(self, watched=None, fail_at=None):
        self.watched = watched
        self.fail_at = fail_at
        self.freeze_counts: list[int] = []
        self.watched_scanned: list[bool] = []

    def batch_end(self, state, logger):
        self.freeze_counts.append(gc.get_freeze_count())
        if self.watched is not None:
            # gc.get_objects() lists what collections scan: not the frozen objects.
            self.watched_scanned.append(any(o is self.watched for o in gc.get_objects()))
        if self.fail_at == state.timestamp.batch:
            raise RuntimeError("stop here")


def fit(watch, device="cpu", **options):
    trainer = Trainer(
        model=mlp(),
        train_dataloader=loader(blobs(64), 16),
        max_duration="2ep",
        device=device,
        progress_bar=False,
        seed=0,
        callbacks=[watch],
        **options,
    )
    trainer.fit()
    return trainer


@pytest.fixture(autouse=True)
def nothing_frozen(monkeypatch):
    # Each test starts with nothing frozen, also where the interpreter starts with objects
    # frozen (the GPU machine's Python 3.12.3 does: 375).
    gc.unfreeze()
    monkeypatch.setattr(_gc, "_frozen_by_interpreter", 0)
    yield
    gc.unfreeze()


def test_the_heap_is_collected_then_frozen_for_the_fit_and_unfrozen_after():
    garbage = Cycle()
    collected = weakref.ref(garbage)
    del garbage
    kept = Cycle()  # alive through the fit: frozen, not scanned by collections during it
    watch = HeapWatch(watched=kept)
    fit(watch, gc_freeze=True)
    assert collected() is None  # the collection before the first batch freed it
    assert len(watch.freeze_counts) == 8
    assert all(count > 1000 for count in watch.freeze_counts)  # every module, the model...
    assert watch.watched_scanned == [False] * 8
    assert gc.get_freeze_count() == 0
    assert any(o is kept for o in gc.get_objects())


def test_a_failing_fit_unfreezes_the_heap():
    watch = HeapWatch(fail_at=3)
    with pytest.raises(Exception, match="stop here"):
        fit(watch, gc_freeze=True)
    assert watch.freeze_counts[-1] > 1000
    assert gc.get_freeze_count() == 0


def test_default_on_cpu_and_false_leave_the_collector_alone():
    for options in ({}, {"gc_freeze": False}):
        kept = Cycle()
        watch = HeapWatch(watched=kept)
        fit(watch, **options)
        assert watch.freeze_counts == [0] * 8
        assert watch.watched_scanned == [True] * 8


def test_a_heap_the_program_froze_is_left_as_it_is():
    gc.freeze()
    frozen = gc.get_freeze_count()
    made_after = Cycle()
    watch = HeapWatch(watched=made_after)
    fit(watch, gc_freeze=True)
    # The program manages the heap: nothing more frozen (frozen objects that die leave
    # the count), nothing unfrozen after.
    assert len(watch.freeze_counts) == 8
    assert all(frozen // 2 < count <= frozen for count in watch.freeze_counts)
    assert watch.watched_scanned == [True] * 8
    assert frozen // 2 < gc.get_freeze_count() <= frozen


def test_objects_the_interpreter_froze_at_startup_do_not_stop_the_freeze(monkeypatch):
    gc.freeze()  # as an interpreter that starts with objects frozen, before trainkit
    # (more than the program freezes below, so the count alone cannot tell them apart)
    monkeypatch.setattr(_gc, "_frozen_by_interpreter", 2 * gc.get_freeze_count())
    made_after = Cycle()
    watch = HeapWatch(watched=made_after)
    fit(watch, gc_freeze=True)
    assert watch.watched_scanned == [False] * 8  # frozen for the fit
    assert gc.get_freeze_count() == 0  # all unfrozen after, the interpreter's too
    # so that any object frozen from now on is the program's own doing
    gc.freeze()
    watch = HeapWatch(watched=Cycle())
    fit(watch, gc_freeze=True)
    assert watch.watched_scanned == [True] * 8


@pytest.mark.gpu
def test_a_cuda_fit_freezes_the_heap_by_default_and_unfreezes_it_after():
    kept = Cycle()
    watch = HeapWatch(watched=kept)
    fit(watch, device="cuda")  # gc_freeze=None: on for a device that is not the CPU
    assert len(watch.freeze_counts) == 8
    assert all(count > 1000 for count in watch.freeze_counts)
    assert watch.watched_scanned == [False] * 8
    assert gc.get_freeze_count() == 0
