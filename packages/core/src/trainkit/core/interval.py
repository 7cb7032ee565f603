"""When something happens: an interval (``"500ba"``, ``"1ep"``, ``"0.1dur"``) as a trigger,
and a time as a fraction of the run."""

from trainkit.core._interval import IntervalTrigger, as_fraction, interval_trigger

__all__ = ["IntervalTrigger", "as_fraction", "interval_trigger"]
