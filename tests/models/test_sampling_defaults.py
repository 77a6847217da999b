"""The model's recommended sampling values, as the server's defaults: only the sampling fields its
generation_config.json sets (Qwen3's), nothing without the file."""
from __future__ import annotations

import json

from radixserve.models.generation import sampling_defaults


def test_only_the_sampling_fields_the_file_sets(tmp_path) -> None:
    assert sampling_defaults(tmp_path) == {}
    (tmp_path / "generation_config.json").write_text(json.dumps({
        "do_sample": True, "temperature": 0.6, "top_p": 0.95, "top_k": 20, "max_new_tokens": 100,
        "eos_token_id": [151645, 151643], "bos_token_id": 151643,
    }))
    assert sampling_defaults(tmp_path) == {"temperature": 0.6, "top_p": 0.95, "top_k": 20}
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 2}))
    assert sampling_defaults(tmp_path) == {}
    # transformers' top_k 0 means no filter: as a default it must not make every request a 400
    (tmp_path / "generation_config.json").write_text(json.dumps({"top_k": 0, "temperature": 0.7}))
    assert sampling_defaults(tmp_path) == {"top_k": -1, "temperature": 0.7}
