"""Generated text → what the API returns: tool calls (forced by a grammar or in the model's own
format), a reasoning model's thinking apart from its answer, and one chat choice's deltas and
message as OpenAI shapes them. Pure text processing: no HTTP, no processes."""
