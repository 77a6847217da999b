"""The HTTP server (OpenAI-compatible API, health, metrics) and its process supervision."""
from __future__ import annotations
