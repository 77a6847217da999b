"""The runtime's ground floor: the types every stage shares (a request, a batch, the forward
context, the request table, what a scheduler step reports). It imports nothing above itself, so
layers, caches, models, engine and scheduler can all depend on it without depending on each other
(the floor plan is `tests/test_import_graph.py`'s `FLOORS`)."""
