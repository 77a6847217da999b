"""Speculative decoding: a drafter proposes the next few tokens of a request, the target model
verifies them in one forward pass and keeps the longest run it would have produced itself, then one
token of its own (`verify.py`): greedy output is the same tokens as plain decoding, sampled output
the same distribution (the standard rejection rule). Drafters: `ngram` (`ngram.py`, the request's
own tokens) and `draft` (`draft.py`, a smaller model run by this engine); `adaptive.py`
drafts fewer tokens, or none, where a request's drafts keep being rejected."""
