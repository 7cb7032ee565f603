"""Merging per-rank Chrome traces into one timeline (chrome://tracing, ui.perfetto.dev)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["merge_chrome_traces"]

_RANK_STRIDE = 10**8  # process ids above this are rank * stride + the rank's own id
_ID_STRIDE = 2**32  # flow-event ids: rank * stride + the rank's own id


def _remap_pid(pid: Any, rank: int) -> Any:
    return rank * _RANK_STRIDE + pid if isinstance(pid, int) else f"rank {rank} {pid}"


def _remap_id(value: Any, rank: int) -> Any:
    return rank * _ID_STRIDE + value if isinstance(value, int) else f"{rank}:{value}"


def _rank_events(trace: dict[str, Any], rank: int, shift_us: float) -> list[dict[str, Any]]:
    events, named = [], set()
    for event in trace.get("traceEvents", []):
        event = dict(event)
        if "pid" in event:
            event["pid"] = _remap_pid(event["pid"], rank)
        if isinstance(event.get("ts"), int | float):
            event["ts"] = event["ts"] + shift_us
        for key in ("id", "bind_id"):
            if key in event and event.get("ph") in ("s", "t", "f"):
                event[key] = _remap_id(event[key], rank)
        if event.get("ph") == "M" and event.get("name") == "process_name":
            named.add(event["pid"])
            args = dict(event.get("args", {}))
            args["name"] = f"rank {rank}: {args.get('name', '')}".rstrip(": ")
            event["args"] = args
        elif event.get("ph") == "M" and event.get("name") == "process_sort_index":
            event["args"] = {"sort_index": rank * _RANK_STRIDE + len(named)}
        events.append(event)
    for pid in {e["pid"] for e in events if "pid" in e} - named:
        events.append(
            {
                "ph": "M",
                "name": "process_name",
                "pid": pid,
                "tid": 0,
                "args": {"name": f"rank {rank}"},
            }
        )
    return events


def merge_chrome_traces(paths: Sequence[str | Path], out: str | Path) -> Path:
    """Write one Chrome trace holding every rank's trace; ``paths[r]`` is rank r's file.

    Each rank's processes are renamed ``rank r: ...`` and renumbered so ranks never share
    a process id; flow arrows stay within their rank; timestamps are aligned on the
    traces' common clock (``baseTimeNanoseconds``) so the ranks line up in time.
    """
    traces = [json.loads(Path(path).read_text()) for path in paths]
    bases = [int(t.get("baseTimeNanoseconds", 0)) for t in traces]
    base = min(bases, default=0)
    merged: dict[str, Any] = {
        key: value for key, value in (traces[0] if traces else {}).items() if key != "traceEvents"
    }
    merged["baseTimeNanoseconds"] = base
    merged["traceName"] = str(out)
    merged["distributedInfo"] = [t.get("distributedInfo") for t in traces]
    merged["traceEvents"] = [
        event
        for rank, (trace, rank_base) in enumerate(zip(traces, bases, strict=True))
        for event in _rank_events(trace, rank, (rank_base - base) / 1000)
    ]
    out = Path(out)
    out.write_text(json.dumps(merged))
    return out
