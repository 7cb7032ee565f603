"""When something happens: an interval (``"500ba"``, ``"1ep"``, ``"0.1dur"``) as a trigger."""

from trainkit.core._interval import IntervalTrigger, interval_trigger

__all__ = ["IntervalTrigger", "interval_trigger"]
