"""One seeding helper for python, numpy and torch (CPU and CUDA)."""
from __future__ import annotations

import os
import random


def seed_everything(seed: int) -> int:
    """Seed python, numpy and torch; returns the seed. Raises ``ValueError`` for a non-integer or negative seed."""
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"SEED must be a non-negative int, got {seed!r}")
    random.seed(seed)
    os.environ["PYTHONHASHSEED"] = str(seed)
    try:
        import numpy as np

        np.random.seed(seed % 2**32)
    except ImportError:  # pragma: no cover
        pass
    try:
        import torch

        torch.manual_seed(seed)
        if torch.cuda.is_available():
            torch.cuda.manual_seed_all(seed)
    except ImportError:  # pragma: no cover
        pass
    return seed
