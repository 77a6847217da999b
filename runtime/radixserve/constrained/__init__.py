"""Grammar-constrained decoding with xgrammar: compilation, per-request matchers, logit masks."""
