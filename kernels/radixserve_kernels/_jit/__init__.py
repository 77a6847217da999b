"""Triton kernel bodies. Importing anything here imports triton: only launchers do, lazily."""
