"""The engine in the caller's process, for `LLM` and the shell: the server's scheduler loop and
detokenizer without sockets (`pipeline.py`), shared by every caller thread and event loop through
one engine loop (`engine_loop.py`)."""
