"""The transformers versions ``kvsift.hf`` is tested with, and the check ``enable`` runs.

The integration touches transformers' internals that moved during 5.x (the ``Cache`` layer classes,
``past_key_values`` renamed ``cache``), so the range is the versions actually tested: 5.24 on the CPU
(CI), and the GPU machine's 5.x. Older 4.x releases have another cache design and are refused;
newer ones run with a warning.
"""

from __future__ import annotations

import warnings
from typing import Tuple

TESTED_MIN = (5, 17)
"""Oldest tested transformers release (major, minor)."""
TESTED_MAX = (5, 24)
"""Newest tested transformers release (major, minor)."""
REQUIREMENT = "transformers>=5.17,<5.25"
"""The same range as a pip requirement (pyproject's ``hf`` extra, scripts/test-python.sh)."""


def _parse(version: str) -> Tuple[int, int]:
    parts = version.split(".")
    try:
        return int(parts[0]), int("".join(ch for ch in parts[1] if ch.isdigit()) or 0)
    except (IndexError, ValueError):
        return (0, 0)


def check_transformers_version(version: str) -> None:
    """Raises ImportError below 5.0; warns outside :data:`TESTED_MIN` .. :data:`TESTED_MAX`."""
    v = _parse(version)
    if v < (5, 0):
        raise ImportError(f"kvsift.hf needs transformers 5.x ({REQUIREMENT}); found {version}")
    if v < TESTED_MIN or v > TESTED_MAX:
        warnings.warn(f"kvsift.hf is tested with {REQUIREMENT}; found transformers {version}", stacklevel=3)


__all__ = ["REQUIREMENT", "TESTED_MAX", "TESTED_MIN", "check_transformers_version"]
