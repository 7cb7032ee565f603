"""Models built on the meta device (``with torch.device("meta"): model = ...``): allocated
where they run and initialised by their own init, part by part (a strategy materialises
each block where its shards live)."""

from trainkit.core._meta import materialize, on_meta

__all__ = ["materialize", "on_meta"]
