"""TEST-ONLY stand-in: optimum.habana.utils.set_seed also seeds the HPU generators."""

from __future__ import annotations


def manual_seed_all(seed: int) -> None:
    return None
