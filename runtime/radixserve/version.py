"""The distribution's version, on the ground floor so any layer can report it."""
from __future__ import annotations

__version__ = "0.1.0"
