"""`--speculative-algorithm` to a `Speculator` with its drafter."""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from radixserve.speculative.drafter import DRAFTERS
from radixserve.speculative.speculator import Speculator

if TYPE_CHECKING:
    from radixserve.config import EngineConfig, SchedulerConfig
    from radixserve.engine.engine import Engine



def create_speculator(engine_cfg: EngineConfig, cfg: SchedulerConfig, target: Engine) -> Speculator:
    name = cfg.speculative_algorithm
    importlib.import_module(f"radixserve.speculative.{name}")  # (each registers its drafter)
    drafter = DRAFTERS.get(name).create(engine_cfg, cfg, target)
    return Speculator(drafter, cfg.speculative_num_draft_tokens)
