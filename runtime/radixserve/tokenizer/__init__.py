"""Tokenize and incremental-detokenize workers."""
from __future__ import annotations
