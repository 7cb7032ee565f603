"""Warnings from trainkit name the user's line (issue 52.8), found by walking the stack."""

import threading
import warnings

from trainkit.core import messages as _warnings


def test_a_warning_names_the_first_line_outside_the_library(monkeypatch):
    def library_call():
        _warnings.warn("from deep inside")

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        library_call()
    assert caught[0].filename == __file__  # this test is the user's code
    assert caught[0].lineno == library_call.__code__.co_firstlineno + 1

    # Counted as the library's, this module's frames are skipped: pytest's line is named.
    monkeypatch.setattr(_warnings, "_LIBRARIES", (*_warnings._LIBRARIES, __name__.split(".")[0]))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        library_call()
    assert caught[0].filename != __file__  # this module now counts as the library


def test_in_a_background_thread_of_the_library_the_warning_names_its_own_line(monkeypatch):
    monkeypatch.setattr(_warnings, "_LIBRARIES", (*_warnings._LIBRARIES, __name__.split(".")[0]))
    found = []

    def in_thread():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            _warnings.warn("from a background thread")
        found.extend(caught)

    thread = threading.Thread(target=in_thread)
    thread.start()
    thread.join()
    # Every frame is the library's (this module, threading): the line that warned is named.
    assert found[0].filename == __file__
    assert found[0].lineno == in_thread.__code__.co_firstlineno + 3
