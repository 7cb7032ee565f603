"""trainkit.profiler."""

__all__: list[str] = []
