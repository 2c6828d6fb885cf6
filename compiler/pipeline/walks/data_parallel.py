"""One GPU, or data parallelism with the whole model on every GPU (DDP): nothing sharded.

Every tensor is its own allocation; a layer's gradients appear in its backward; torch's
optimizer steps group by group (`optimizer_step.step_temporaries`), and the replay sees its
temporaries tensor by tensor. Step 1 makes the states inside step()
(`optimizer_step._first_step_optimizer`).
"""

from __future__ import annotations

from typing import Mapping

from ..resolve import Setup
from .base import Walk
from .optimizer_step import _first_step_events, _first_step_optimizer, _step_events, step_temporaries
from .resident import _shards
from .timeline import Point


class DataParallelWalk(Walk):
    rank = 90
    exclusive = True

    @classmethod
    def applies(cls, setup: Setup, trainable: int) -> bool:
        return True  # NB: the walk of every setup no other placing walk takes

    def shards(self) -> tuple[int, int, int]:
        return _shards(self.setup)

    def _exact(self) -> bool:
        """Unsharded and training: the step's allocations are known tensor by tensor."""
        return self.shards()[2] == 1 and bool(self.step.trainable)

    def optimizer_step(self) -> Mapping[str, int]:
        step = self.step
        return step.last_module(sum(step_temporaries(self.setup, step.stepped, step.largest, self.shards()[2]).values()))

    def step_allocations(self) -> list | None:
        return _step_events(self.setup, self.step.stepped, self.step.largest) if self._exact() else None

    def first_step_allocations(self, once: list[int]) -> list | None:
        return _first_step_events(self.setup, self.step.stepped, self.step.largest, once) if self._exact() else None

    def first_step(self, step: Point, transient: Mapping[str, int]) -> Point:
        """NB: sharded (ZeRO at dp > 1), step 1's optimizer point is the steady one: an upper
        bound (its states are made during the step as well)."""
        if not self._exact():
            return step
        s = self.step
        return _first_step_optimizer(self.setup, s.stepped, s.largest, step, transient, s.modules)


WALKS = (DataParallelWalk,)
