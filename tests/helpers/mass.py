"""A pool of expert slots for tests that drive ``moelab.mass.MassPool`` from tables instead of a model."""
import numpy as np


class SlotView:
    """``slots`` expert slots, the first ``init`` active; subclasses add ``grad_norms``, ``cos`` and the loss gap."""

    def __init__(self, slots, init):
        self.act = np.zeros(slots, bool)
        self.act[:init] = True

    def active(self):
        return np.flatnonzero(self.act)

    def free(self):
        return np.flatnonzero(~self.act)

    def n_active(self):
        return int(self.act.sum())
