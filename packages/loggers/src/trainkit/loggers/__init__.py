"""trainkit.loggers: logger destinations, registered under the ``trainkit.loggers`` entry points."""

from trainkit.loggers._progress import ProgressBar

__all__ = ["ProgressBar"]
