"""What every drafter does, and the registry `--speculative-algorithm` picks from."""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

from radixserve.engine.engine import NO_COMPANION, Companion
from radixserve.speculative.tree import Step, branch_paths
from radixserve.utils.registry import Registry

if TYPE_CHECKING:
    from radixserve.config import EngineConfig, SchedulerConfig
    from radixserve.core.request import Req
    from radixserve.core.table import TableManager
    from radixserve.engine.engine import Engine
    from radixserve.kvcache.allocator import PageAllocator

DRAFTERS: Registry[type[BaseDrafter]] = Registry("speculative algorithm")


class BaseDrafter(ABC):
    @classmethod
    def plan(cls, engine_cfg: EngineConfig, cfg: SchedulerConfig) -> tuple[Companion, Any]:
        """Before the target's engine: the memory the drafter will hold beside it, and whatever
        `create` should be handed (resolved once)."""
        return NO_COMPANION, None

    @classmethod
    def target_config(cls, engine_cfg: EngineConfig) -> EngineConfig:
        """The target's engine config with what this drafter needs of it (default: as given)."""
        return engine_cfg

    @classmethod
    @abstractmethod
    def create(cls, engine_cfg: EngineConfig, cfg: SchedulerConfig, target: Engine,
               context: Any) -> BaseDrafter:
        """The drafter the configs ask for, beside the target's engine."""

    @abstractmethod
    def propose(self, reqs: list[Req], lengths: list[int]) -> list[list[int]]:
        """Up to `lengths[i]` tokens that may follow request i's tokens so far (its prompt and
        output): fewer, or none, where the drafter has no guess. Greedy and deterministic: the
        same request state gives the same drafts on every rank."""

    def propose_paths(self, reqs: list[Req], lengths: list[int],
                      breadth: int) -> list[list[list[int]]]:
        """Up to `breadth` candidate continuations of request i, best first, each of at most
        `lengths[i]` tokens (a tree of drafts: `speculative/tree.py`). By default the one of
        `propose`."""
        return [[d] if d else [] for d in self.propose(reqs, lengths)]

    def release(self, req: Req) -> None:
        """The request is done: forget what is kept for it (a draft model's KV)."""


class StepDrafter(BaseDrafter):
    """A model that drafts greedily, a step a token (a draft model, an EAGLE-3 head): its chain,
    and with `--speculative-eagle-topk` each step's next likeliest tokens as branches off it."""

    @abstractmethod
    def draft_steps(self, reqs: list[Req], lengths: list[int], k: int) -> list[list[Step]]:
        """Each request's chain of up to `lengths[i]` steps: the `k` likeliest tokens of each,
        the chain's first."""

    def propose(self, reqs: list[Req], lengths: list[int]) -> list[list[int]]:
        return [[s[0][0] for s in steps] for steps in self.draft_steps(reqs, lengths, 1)]

    def propose_paths(self, reqs: list[Req], lengths: list[int],
                      breadth: int) -> list[list[list[int]]]:
        return [branch_paths(s) if s else [] for s in self.draft_steps(reqs, lengths, breadth)]


def free_row(rows: dict[int, Any], uid: int, allocator: PageAllocator, table: TableManager) -> None:
    """A model drafter's request is done: its own row of the drafter's page table and its KV slots
    (`rows[uid]`, with `row` and `slots`) go back."""
    rec = rows.pop(uid, None)
    if rec is not None:
        allocator.free(allocator.slots_to_pages(rec.slots))
        table.free_row(rec.row)
