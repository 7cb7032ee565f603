"""trainkit.checkpoint."""

__all__: list[str] = []
