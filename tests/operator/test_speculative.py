"""spec.speculative: the server of every replica decodes speculatively with the flags the runtime
reads (its own parser and config accept them and hold the spec's values); a hub draft model is
fetched into the model cache by an init container as the model is (the server then offline), a
pvc:// one read from a read-only mount of its claim; the flags are the operator's; values beyond
the CRD, or against its rules, are refused with the field named, in a status and an event."""

from __future__ import annotations

import argparse
import itertools
from typing import Any

import kopf
import pytest

from radixserve_operator import handlers, rules
from radixserve_operator.builders import server_args
from radixserve_operator.crd import (
    MAX_DRAFT_TOKENS,
    MAX_NGRAM_WINDOW,
    MAX_TREE_BREADTH,
    SPECULATIVE_ALGORITHMS,
)
from radixserve_operator.reconcile import plan
from radixserve_operator.rules import DRAFT_TOKENS_DEFAULT, NGRAM_WINDOW_DEFAULTS
from radixserve_operator.spec import SpecError, parse_spec


def _pod(make_body, fetch, spec: dict[str, Any], validate_k8s=None) -> dict[str, Any]:
    _, _, (workload, *_), _ = plan(make_body(spec), fetch)
    if validate_k8s is not None:
        validate_k8s(workload)
    return workload["spec"]["template"]["spec"]


def _args(pod: dict[str, Any]) -> list[str]:
    (server,) = pod["containers"]
    return server["args"]


def _speculative_args(args: list[str]) -> list[str]:
    flags = [i for i, a in enumerate(args) if a.startswith("--speculative-")]
    return args[flags[0]:] if flags else []


def _server_config(args: list[str]) -> Any:
    """The config the runtime would run with: its own parser, then its own checks."""
    from radixserve.cli import serve as serve_cli
    from radixserve.cli.preflight import server_config

    parser = argparse.ArgumentParser(prog="radixserve", exit_on_error=False)
    serve_cli.add_parser(parser.add_subparsers(dest="command", required=True))
    return server_config(parser.parse_args(args))


def _runtime_config(args: list[str]) -> Any:
    return _server_config(args).scheduler


def test_ngram_reaches_the_server_as_the_runtime_reads_it(make_body, fetch, validate_k8s) -> None:
    spec = {"speculative": {"algorithm": "ngram", "numDraftTokens": 6, "disableByBatchSize": 8,
                            "ngram": {"minMatchWindow": 3, "maxMatchWindow": 12}}}
    pod = _pod(make_body, fetch, spec, validate_k8s)
    args = _args(pod)
    assert _speculative_args(args) == [
        "--speculative-algorithm", "ngram", "--speculative-num-draft-tokens", "6",
        "--speculative-ngram-min-match-window-size", "3",
        "--speculative-ngram-max-match-window-size", "12",
        "--speculative-disable-by-batch-size", "8"]
    cfg = _runtime_config(args)
    assert (cfg.speculative_algorithm, cfg.speculative_num_draft_tokens) == ("ngram", 6)
    assert cfg.speculative_disable_by_batch_size == 8
    assert (cfg.speculative_ngram_min_match_window_size,
            cfg.speculative_ngram_max_match_window_size) == (3, 12)
    assert cfg.speculative_draft_model_path is None
    assert "initContainers" not in pod  # nothing to fetch: the embedded model, no draft model


def test_ngram_alone_leaves_the_runtimes_defaults(make_body, fetch) -> None:
    args = _args(_pod(make_body, fetch, {"speculative": {"algorithm": "ngram"}}))
    assert _speculative_args(args) == ["--speculative-algorithm", "ngram"]
    cfg = _runtime_config(args)
    assert (cfg.speculative_ngram_min_match_window_size,
            cfg.speculative_ngram_max_match_window_size) == NGRAM_WINDOW_DEFAULTS


def test_an_eagle_tree_reaches_the_server_as_the_runtime_reads_it(make_body, fetch,
                                                                  validate_k8s) -> None:
    spec = {"speculative": {"algorithm": "eagle3", "numDraftTokens": 8, "numSteps": 3,
                            "eagleTopk": 4, "draftModel": {"source": "/opt/eagle3"}}}
    args = _args(_pod(make_body, fetch, spec, validate_k8s))
    assert _speculative_args(args) == [
        "--speculative-algorithm", "eagle3", "--speculative-num-draft-tokens", "8",
        "--speculative-num-steps", "3", "--speculative-eagle-topk", "4",
        "--speculative-draft-model-path", "/opt/eagle3"]
    cfg = _server_config(args)
    sched = cfg.scheduler
    assert (sched.speculative_num_draft_tokens, sched.speculative_num_steps,
            sched.speculative_eagle_topk) == (8, 3, 4)
    assert (sched.speculative_breadth, sched.speculative_depth) == (4, 3)  # a tree, 3 deep
    assert "--page-size" not in args and cfg.engine.page_size == 1  # the runtime's, which it needs


def test_an_ngram_tree_reaches_the_server_as_the_runtime_reads_it(make_body, fetch) -> None:
    spec = {"runtime": {"pageSize": 1},
            "speculative": {"algorithm": "ngram", "numDraftTokens": 6,
                            "ngram": {"maxMatchWindow": 5, "maxBfsBreadth": 3}}}
    args = _args(_pod(make_body, fetch, spec))
    assert _speculative_args(args) == [
        "--speculative-algorithm", "ngram", "--speculative-num-draft-tokens", "6",
        "--speculative-ngram-max-match-window-size", "5",
        "--speculative-ngram-max-bfs-breadth", "3"]
    cfg = _server_config(args)
    assert (cfg.scheduler.speculative_ngram_max_bfs_breadth, cfg.scheduler.speculative_breadth) == (3, 3)
    assert cfg.scheduler.speculative_num_steps is None  # left out: the runtime's own default
    assert cfg.engine.page_size == 1


def test_a_chain_may_name_its_steps(make_body, fetch) -> None:
    """numSteps equal to numDraftTokens (or to the runtime's default of it, left out) is a chain."""
    for speculative, steps in (({"algorithm": "ngram", "numDraftTokens": 5, "numSteps": 5}, 5),
                               ({"algorithm": "ngram", "numSteps": DRAFT_TOKENS_DEFAULT},
                                DRAFT_TOKENS_DEFAULT)):
        args = _args(_pod(make_body, fetch, {"speculative": speculative}))
        assert args[args.index("--speculative-num-steps") + 1] == str(steps)
        sched = _runtime_config(args)
        assert (sched.speculative_num_steps, sched.speculative_breadth) == (steps, 1)


_EAGLE = {"algorithm": "eagle3", "draftModel": {"source": "/opt/eagle3"}}


@pytest.mark.parametrize("tree, chain", [
    (_EAGLE | {"eagleTopk": 2}, _EAGLE | {"eagleTopk": 1}),
    ({"algorithm": "ngram", "ngram": {"maxBfsBreadth": 2}},
     {"algorithm": "ngram", "ngram": {"maxBfsBreadth": 1}}),
], ids=["eagle-topk", "ngram-breadth"])
def test_a_tree_refuses_a_page_size_the_runtime_would_refuse(make_body, fetch, tree, chain) -> None:
    with pytest.raises(SpecError, match=r"^spec.runtime.pageSize: a speculative tree .* needs "
                                        r"pageSize 1"):
        parse_spec(make_body({"runtime": {"pageSize": 16}, "speculative": tree}))
    # a chain takes any page size
    args = _args(_pod(make_body, fetch, {"runtime": {"pageSize": 16}, "speculative": chain}))
    assert _server_config(args).engine.page_size == 16


def _runtime_refuses(args: list[str]) -> str | None:
    """Why the runtime would not start with `args`: its parser and config's checks, and the
    scheduler's own check of a tree's page size (which runs only beside a loaded model)."""
    from radixserve.cli.preflight import UsageError

    try:
        cfg = _server_config(args)
    except UsageError as e:
        return str(e)
    if cfg.scheduler.speculative_breadth > 1 and cfg.engine.page_size != 1:
        return "a tree needs page size 1"
    return None


def test_the_crd_refuses_the_trees_and_steps_the_runtime_refuses(make_body, monkeypatch) -> None:
    """Every combination of the fields that bear on a tree: what the CRD's rules (the operator's
    parser evaluates the same table) accept, the runtime starts with, and what they refuse it
    would not start with, but for the ngram object beside draft, which the CRD refuses whole."""
    # the rules that read spec.speculative: the others judge nothing here, and cost time
    speculative_rules = tuple(r for r in rules.RULES if "speculative" in r.path + r.rule)
    assert len(speculative_rules) >= 4
    mismatched, verdicts = [], set()
    drafts = (None, 3, 6)
    steps = (None, 3, 4, 6, 7)  # below, at and above the runtime's 4 and the 3 and 6 given
    breadths = (None, 1, 2)
    for algorithm, n, k, topk, bfs, page in itertools.product(
            ("ngram", "draft"), drafts, steps, breadths, breadths, (None, 16)):
        speculative: dict[str, Any] = {"algorithm": algorithm}
        if algorithm == "draft":
            speculative["draftModel"] = {"source": "/opt/draft"}
        for key, value in (("numDraftTokens", n), ("numSteps", k), ("eagleTopk", topk)):
            if value is not None:
                speculative[key] = value
        if bfs is not None:
            speculative["ngram"] = {"maxBfsBreadth": bfs}
        body = make_body({"speculative": speculative}
                         | ({"runtime": {"pageSize": page}} if page is not None else {}))
        try:
            with monkeypatch.context() as m:
                m.setattr(rules, "RULES", speculative_rules)
                parse_spec(body)
            crd_refuses = None
        except SpecError as e:
            crd_refuses = str(e)
        with monkeypatch.context() as m:  # the args the server would get without the rules
            m.setattr(rules, "RULES", ())
            runtime_refuses = _runtime_refuses(server_args(parse_spec(body), 1))
        stricter = algorithm != "ngram" and bfs is not None
        if stricter:
            ok = crd_refuses is not None
        else:
            ok = (crd_refuses is None) == (runtime_refuses is None)
        if not ok:
            mismatched.append((speculative, page, crd_refuses, runtime_refuses))
        verdicts.add(runtime_refuses is None)
    assert mismatched == []
    assert verdicts == {True, False}  # the grid holds both what starts and what does not


def test_a_hub_draft_model_is_fetched_as_the_model_is(make_body, fetch, validate_k8s) -> None:
    spec = {"model": {"source": "Qwen/Qwen3-14B", "hfTokenSecret": {"name": "hub"}},
            "speculative": {"algorithm": "draft", "numDraftTokens": 5,
                            "draftModel": {"source": "Qwen/Qwen3-0.6B"}}}
    pod = _pod(make_body, fetch, spec, validate_k8s)
    (server,) = pod["containers"]
    assert _speculative_args(server["args"]) == [
        "--speculative-algorithm", "draft", "--speculative-num-draft-tokens", "5",
        "--speculative-draft-model-path", "Qwen/Qwen3-0.6B"]
    cfg = _runtime_config(server["args"])
    assert (cfg.speculative_algorithm, cfg.speculative_draft_model_path) == ("draft", "Qwen/Qwen3-0.6B")
    # the model first, then the draft model, by the same command into the same cache, with the
    # hub token; the server reads both from that cache offline
    model, draft = pod["initContainers"]
    assert (model["name"], model["args"]) == ("model-download", ["download", "Qwen/Qwen3-14B"])
    assert (draft["name"], draft["args"]) == ("draft-download", ["download", "Qwen/Qwen3-0.6B"])
    assert draft["volumeMounts"] == model["volumeMounts"] == server["volumeMounts"]
    assert draft["env"] == model["env"] and draft["image"] == server["image"]
    assert draft["resources"] == model["resources"]
    assert any(e["name"] == "HF_TOKEN" for e in draft["env"])
    assert not any(e["name"] == "RADIXSERVE_MODEL_REVISION" for e in draft["env"])
    assert {"name": "HF_HUB_OFFLINE", "value": "1"} in server["env"]
    assert not any(v["name"] == "draft-source" for v in pod["volumes"])


def test_a_hub_draft_beside_the_embedded_model_is_the_only_download(make_body, fetch) -> None:
    spec = {"speculative": {"algorithm": "draft", "draftModel": {"source": "org/small-draft"}}}
    _, _, (workload, *_), _ = plan(make_body(spec), fetch)
    pod = workload["spec"]["template"]["spec"]
    assert [(c["name"], c["args"]) for c in pod["initContainers"]] == [
        ("draft-download", ["download", "org/small-draft"])]
    assert {"name": "HF_HUB_OFFLINE", "value": "1"} in pod["containers"][0]["env"]
    # a download before the startup window: the rollout's deadline allows for it
    without = plan(make_body({}), fetch)[2][0]["spec"]["progressDeadlineSeconds"]
    assert workload["spec"]["progressDeadlineSeconds"] > without


def test_a_pvc_draft_model_is_read_from_its_claim_mounted_read_only(make_body, fetch,
                                                                    validate_k8s) -> None:
    spec = {"model": {"source": "Qwen/Qwen3-14B"},
            "speculative": {"algorithm": "draft", "draftModel": {"source": "pvc://drafts/qwen3/0.6b"}}}
    pod = _pod(make_body, fetch, spec, validate_k8s)
    (server,) = pod["containers"]
    args = server["args"]
    assert args[args.index("--speculative-draft-model-path") + 1] == "/draft/drafts/qwen3/0.6b"
    assert _runtime_config(args).speculative_draft_model_path == "/draft/drafts/qwen3/0.6b"
    assert {"name": "draft-source", "persistentVolumeClaim": {"claimName": "drafts", "readOnly": True}} \
        in pod["volumes"]
    assert {"name": "draft-source", "mountPath": "/draft/drafts", "readOnly": True} \
        in server["volumeMounts"]
    # only the model is downloaded
    assert [c["name"] for c in pod["initContainers"]] == ["model-download"]


@pytest.mark.parametrize("source, path", [
    ("pvc://models/qwen3-0.6b", "/models/models/qwen3-0.6b"),  # the model's claim
    ("pvc://ads/qwen3-0.6b", "/lora/ads/qwen3-0.6b"),  # an adapter's claim
])
def test_a_claim_mounted_already_is_not_mounted_twice(make_body, fetch, validate_k8s, source: str,
                                                      path: str) -> None:
    spec = {"model": {"source": "pvc://models/qwen3-8b"},
            "lora": {"adapters": [{"name": "sql", "source": "pvc://ads/sql"}]},
            "speculative": {"algorithm": "draft", "draftModel": {"source": source}}}
    pod = _pod(make_body, fetch, spec, validate_k8s)
    args = _args(pod)
    assert args[args.index("--speculative-draft-model-path") + 1] == path
    claims = [v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"]
              if "persistentVolumeClaim" in v]
    assert sorted(claims) == ["ads", "models"]


def test_an_absolute_draft_path_is_passed_as_it_is(make_body, fetch) -> None:
    spec = {"speculative": {"algorithm": "draft", "draftModel": {"source": "/opt/draft"}}}
    pod = _pod(make_body, fetch, spec)
    assert _speculative_args(_args(pod)) == [
        "--speculative-algorithm", "draft", "--speculative-draft-model-path", "/opt/draft"]
    assert "initContainers" not in pod


def test_no_speculative_no_flag_and_no_draft(make_body, fetch) -> None:
    pod = _pod(make_body, fetch, {"model": {"source": "Qwen/Qwen3-0.6B"}})
    assert not any("speculative" in a for a in _args(pod))
    assert [c["name"] for c in pod["initContainers"]] == ["model-download"]
    assert not any(v["name"] == "draft-source" for v in pod["volumes"])
    assert _runtime_config(_args(pod)).speculative_algorithm == "none"


@pytest.mark.parametrize("flag", [
    "--speculative-algorithm", "--speculative-algorithm=ngram", "--speculative-num-draft-tokens",
    "--speculative-draft-model-path=/x", "--speculative-ngram-min-match-window-size",
    "--speculative-ngram-max-match-window-size", "--speculative-draft",  # a prefix argparse expands
    "--speculative-num-steps=2", "--speculative-eagle-topk", "--speculative-ngram-max-bfs-breadth",
    "--speculative-eagle", "--speculative-disable-by-batch-size=4",
])
def test_the_speculative_flags_are_the_operators(make_body, flag: str) -> None:
    with pytest.raises(SpecError, match=r"^spec.runtime.extraArgs\[1\]: .* is the operator's "
                                        r"\(--speculative-[a-z-]+\): set it through spec.speculative$"):
        parse_spec(make_body({"runtime": {"extraArgs": ["--disable-overlap", flag]}}))


def test_the_crd_bounds_are_the_runtimes() -> None:
    from radixserve.config import SchedulerConfig
    from radixserve.options import declared

    def fault(name: str, value: int) -> str | None:
        check = declared(SchedulerConfig, name).check
        assert check is not None
        return check(value)

    assert fault("speculative_num_draft_tokens", MAX_DRAFT_TOKENS) is None
    assert fault("speculative_num_draft_tokens", MAX_DRAFT_TOKENS + 1) is not None
    assert fault("speculative_num_draft_tokens", 0) is not None
    for name in ("speculative_ngram_min_match_window_size", "speculative_ngram_max_match_window_size"):
        assert fault(name, MAX_NGRAM_WINDOW) is None and fault(name, 1) is None
        assert fault(name, MAX_NGRAM_WINDOW + 1) is not None and fault(name, 0) is not None
    assert fault("speculative_num_steps", MAX_DRAFT_TOKENS) is None
    assert fault("speculative_num_steps", MAX_DRAFT_TOKENS + 1) is not None
    assert fault("speculative_num_steps", 0) is not None
    for name in ("speculative_eagle_topk", "speculative_ngram_max_bfs_breadth"):
        assert fault(name, MAX_TREE_BREADTH) is None and fault(name, 1) is None
        assert fault(name, MAX_TREE_BREADTH + 1) is not None and fault(name, 0) is not None
    defaults = SchedulerConfig()
    assert (defaults.speculative_ngram_min_match_window_size,
            defaults.speculative_ngram_max_match_window_size) == NGRAM_WINDOW_DEFAULTS
    assert defaults.speculative_num_draft_tokens == DRAFT_TOKENS_DEFAULT
    # a tree's fields left out: a chain, as the CRD's rules count them
    assert defaults.speculative_eagle_topk == defaults.speculative_ngram_max_bfs_breadth == 1
    choices = declared(SchedulerConfig, "speculative_algorithm").choices or ()
    assert set(SPECULATIVE_ALGORITHMS) == set(choices) - {"none"}


HOSTILE = {
    "draft-tokens-a-billion": ({"algorithm": "ngram", "numDraftTokens": 10**9},
                               "spec.speculative.numDraftTokens: "),
    "disable-by-batch-size-zero": ({"algorithm": "ngram", "disableByBatchSize": 0},
                                   "spec.speculative.disableByBatchSize: "),
    "window-zero": ({"algorithm": "ngram", "ngram": {"minMatchWindow": 0}},
                    "spec.speculative.ngram.minMatchWindow: "),
    "algorithm-unknown": ({"algorithm": "eagle"}, "spec.speculative.algorithm: "),
    "draft-source-a-flag": ({"algorithm": "draft", "draftModel": {"source": "--model=/etc"}},
                            "spec.speculative.draftModel.source: "),
    "draft-without-model": ({"algorithm": "draft"},
                            "spec.speculative.draftModel: draftModel is needed by algorithms draft and eagle3"),
    "windows-crossed": ({"algorithm": "ngram", "ngram": {"minMatchWindow": 40, "maxMatchWindow": 4}},
                        "spec.speculative.ngram: minMatchWindow must not exceed maxMatchWindow"),
    "steps-17": ({"algorithm": "ngram", "numSteps": 17}, "spec.speculative.numSteps: "),
    "topk-zero": ({"algorithm": "draft", "draftModel": {"source": "/opt/draft"}, "eagleTopk": 0},
                  "spec.speculative.eagleTopk: "),
    "breadth-9": ({"algorithm": "ngram", "ngram": {"maxBfsBreadth": 9}},
                  "spec.speculative.ngram.maxBfsBreadth: "),
    "topk-with-ngram": ({"algorithm": "ngram", "eagleTopk": 2},
                        "spec.speculative.eagleTopk: eagleTopk above 1 branches"),
    "breadth-with-draft": ({"algorithm": "draft", "draftModel": {"source": "/opt/draft"},
                            "ngram": {"maxBfsBreadth": 2}}, "spec.speculative.ngram: ngram is for"),
    "steps-past-the-tree": ({"algorithm": "ngram", "numDraftTokens": 6, "numSteps": 7,
                             "ngram": {"maxBfsBreadth": 2}},
                            "spec.speculative.numSteps: numSteps must not exceed numDraftTokens"),
    "chain-shorter-than-its-drafts": ({"algorithm": "ngram", "numSteps": 3},
                                      "spec.speculative.numSteps: numSteps of a chain"),
}  # fmt: skip


@pytest.mark.parametrize("case", HOSTILE, ids=str)
def test_a_bad_speculative_spec_is_a_status_an_event_and_nothing_applied(cluster, memo, make_body,
                                                                         case: str) -> None:
    """As an older CRD (or none) would let these through: the operator's own judgement."""
    speculative, said = HOSTILE[case]
    with pytest.raises(kopf.PermanentError, match="InvalidSpec"):
        handlers.on_create(body=cluster.create(make_body({"speculative": speculative})), memo=memo,
                           logger=None)
    assert cluster.applied == []
    (ready,) = [c for c in cluster.resource()["status"]["conditions"] if c["type"] == "Ready"]
    assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec")
    assert ready["message"].startswith(said), ready["message"]
    assert [(t, r) for t, r, _ in cluster.events] == [("Warning", "InvalidSpec")]


def test_a_pod_downloading_its_draft_model_says_so() -> None:
    from radixserve_operator.status import pod_problems

    pod = {"metadata": {"name": "llm-0"}, "status": {"phase": "Pending", "initContainerStatuses": [
        {"name": "draft-download", "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}]}}
    assert pod_problems([pod]).not_ready == [
        "llm-0: init container draft-download running (downloading the draft model)"]
