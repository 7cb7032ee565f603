"""Seeding and the random-number-generator state saved with a run."""

from trainkit.core._rng import get_rng_state, random_seed, seed_everything, set_rng_state

__all__ = ["get_rng_state", "random_seed", "seed_everything", "set_rng_state"]
