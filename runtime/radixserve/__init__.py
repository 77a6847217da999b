"""radixserve: a compact, fast LLM serving engine."""
from __future__ import annotations

from typing import TYPE_CHECKING

from radixserve.sampling_params import SamplingParams
from radixserve.version import __version__

if TYPE_CHECKING:
    from radixserve.llm import LLM

__all__ = ["LLM", "SamplingParams", "__version__"]


def __getattr__(name: str):  # lazy: `import radixserve` stays light for the server's children
    if name == "LLM":
        from radixserve.llm import LLM

        return LLM
    raise AttributeError(name)
