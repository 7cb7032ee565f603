"""The plain progress lines the Trainer prints when trainkit-loggers is not installed."""

from trainkit.core._progress import ProgressLines, ProgressLinesConfig

__all__ = ["ProgressLines", "ProgressLinesConfig"]
