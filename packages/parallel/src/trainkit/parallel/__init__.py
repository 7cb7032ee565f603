"""trainkit.parallel."""

__all__: list[str] = []
