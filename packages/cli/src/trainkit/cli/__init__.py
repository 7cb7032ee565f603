"""trainkit.cli: the ``trainkit`` command."""

from trainkit.cli._main import main

__all__ = ["main"]
