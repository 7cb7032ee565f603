"""trainkit.algorithms."""

__all__: list[str] = []
