"""Every test here also checks each method's ``match_events`` against its ``match``.

The engine asks an algorithm's ``match`` only at its declared ``match_events``. Here it is
asked at every other event too (as when none are declared), and saying yes at an event it
did not declare fails the test: the engine would have skipped that event in a real run.
"""

from __future__ import annotations

import pytest

from trainkit.core import _engine


@pytest.fixture(autouse=True)
def match_events_cover_match(monkeypatch):
    undeclared: list[tuple[str, str]] = []
    run_algorithms, may_match = _engine.Engine._run_algorithms, _engine._may_match

    def asking_every_algorithm(self, event, candidates):
        declared = []
        for algorithm in candidates:
            if may_match(algorithm, event):
                declared.append(algorithm)
            elif algorithm.match(event, self.state):
                undeclared.append((type(algorithm).__name__, event.name))
        return run_algorithms(self, event, declared)

    monkeypatch.setattr(_engine, "_may_match", lambda algorithm, event: True)
    monkeypatch.setattr(_engine.Engine, "_run_algorithms", asking_every_algorithm)
    yield
    assert not undeclared, f"match() said yes at events missing from match_events: {undeclared}"
