"""`radixserve bench offline --compare-constrained`: one command times the workload unconstrained
and with every request constrained by the JSON schema, and prints both and their ratio."""
from __future__ import annotations

import json
import re

import pytest

from radixserve.cli import main
from tests.runtime.test_bench_offline import ARGS, tok_s


def test_compare_constrained_prints_both(tiny_ckpts, capsys) -> None:
    argv = [*ARGS, "--model", str(tiny_ckpts["llama"]), "--baseline", "none",
            "--compare-constrained"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    plain, constrained = tok_s(out, "radixserve"), tok_s(out, "radixserve json-schema")
    assert plain > 0 and constrained > 0
    assert re.search(r"every request JSON-schema constrained \(\d+ of \d+ tokens made\)", out)
    ratio = float(re.search(r"ratio json-schema/plain\s+([\d.]+)x", out).group(1))
    assert ratio == pytest.approx(constrained / plain, rel=0.01)


def test_json_schema_file_constrains_the_main_run(tiny_ckpts, tmp_path, capsys) -> None:
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps({"type": "object", "properties": {"ok": {"type": "boolean"}},
                                  "required": ["ok"], "additionalProperties": False}))
    argv = [*ARGS, "--model", str(tiny_ckpts["llama"]), "--baseline", "none", "--json-schema",
            str(schema)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert tok_s(out, "radixserve") > 0 and "JSON-schema constrained" in out
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    with pytest.raises(SystemExit, match="--json-schema"):
        main([*argv[:-1], str(bad)])
    bad.write_text('{"type": "nope"}')  # JSON, but no schema xgrammar compiles
    with pytest.raises(SystemExit, match="json_schema: could not compile the grammar"):
        main([*argv[:-1], str(bad)])
