"""`--speculative-algorithm` to a `Speculator` with its drafter, in two steps: what the drafter
will hold is known before the target's engine sizes its KV pool (`plan`: a draft model's weights
and KV), the drafter is made once the target exists (`create_speculator`)."""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, NamedTuple

from radixserve.engine.engine import Companion
from radixserve.speculative.drafter import DRAFTERS, BaseDrafter
from radixserve.speculative.speculator import Speculator

if TYPE_CHECKING:
    from radixserve.config import EngineConfig, SchedulerConfig
    from radixserve.engine.engine import Engine


class SpeculativePlan(NamedTuple):
    drafter: type[BaseDrafter]
    companion: Companion  # what the target's KV sizing leaves room for
    context: Any = None  # what the drafter's `plan` resolved (a draft model's source)
    engine: EngineConfig | None = None  # the target's engine config, as the drafter needs it


def plan(engine_cfg: EngineConfig, cfg: SchedulerConfig) -> SpeculativePlan:
    name = cfg.speculative_algorithm
    importlib.import_module(f"radixserve.speculative.{name}")  # (each registers its drafter)
    drafter = DRAFTERS.get(name)
    engine_cfg = drafter.target_config(engine_cfg)
    companion, context = drafter.plan(engine_cfg, cfg)
    return SpeculativePlan(drafter, companion, context, engine_cfg)


def create_speculator(p: SpeculativePlan, engine_cfg: EngineConfig, cfg: SchedulerConfig,
                      target: Engine) -> Speculator:
    return Speculator(p.drafter.create(engine_cfg, cfg, target, p.context),
                      cfg.speculative_depth, cfg.speculative_disable_by_batch_size,
                      breadth=cfg.speculative_breadth, nodes=cfg.speculative_num_draft_tokens)

