"""The CRD's CEL rules (x-kubernetes-validations), one table for both judges: `crd.py` writes each
rule into the schema at its path, and `violations` evaluates the very same expressions with
cel-python, so the operator refuses what the API server refuses, in the API server's words.

Why the operator judges them too, rather than trusting the API server: Helm installs a chart's
crds/ once and never upgrades them, so an operator can run under an older CRD that lacks a newer
rule, and resources parsed outside an API server (tests, tools) never met one. Why CEL evaluated
here rather than a Python copy of each rule: a copy can drift from the CEL; the same expression
cannot. What the OpenAPI part of the schema says (enums, bounds, list maps) and what no schema
says (`spec.py`) stay Python checks.

As the API server does: a rule runs only where its field is present (nulls pruned), after
defaulting, on values typed by the schema (a `number` field is a double even when written 80)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import celpy
from celpy import celtypes

from radixserve_operator import LABEL_INSTANCE, LABEL_NAME

SELECTOR_LABEL_KEYS = (LABEL_NAME, LABEL_INSTANCE)  # the Deployment's selector: not the user's


ROOT = "/"  # a Rule.path for the resource itself: `self.metadata.name` and `self.spec`


@dataclass(frozen=True)
class Rule:
    path: str  # the schema node under spec that holds the rule ("" is spec itself, ROOT the resource)
    rule: str  # CEL; `self` is the value at path
    message: str
    field_path: str | None = None  # the field under path that the API server's error names

    @property
    def field(self) -> str:
        """The field an error names, as the API server names it: spec.model.cache, spec.gpu."""
        if self.path == ROOT:
            return ""  # its messages name metadata.name: the API server reports no field for it
        parts = ("spec", self.path, (self.field_path or "").lstrip("."))
        return ".".join(p for p in parts if p)

    def validation(self) -> dict[str, str]:
        """The rule as an entry of x-kubernetes-validations."""
        out = {"rule": self.rule, "message": self.message}
        if self.field_path:
            out["fieldPath"] = self.field_path
        return out


def _is_zero(field: str) -> str:  # an int-or-string count or percentage that is zero
    return f"string({field}) in ['0', '0%']"


PER_REPLICA_ROLLOUT = (
    "model.cache type pvcPerReplica runs a StatefulSet, which replaces each pod in place with its "
    "own volume: rollout.strategy must be RollingUpdate with maxSurge 0 (its default there) and "
    "maxUnavailable above 0"
)
# The names the operator derives from metadata.name: the Service NAME (a DNS-1035 label), the
# router's NAME-router, and a StatefulSet's pods' label controller-revision-hash=NAME-<hash of
# up to 10 characters>; label values are at most 63 characters.
NAME_MAX = 63
ROUTER_SUFFIX = "-router"
STATEFULSET_NAME_MAX = NAME_MAX - 11
_RESOURCES = "self.template.spec.container.resources"
# The runtime's ngram match windows (min, max) where spec.speculative.ngram leaves one out
NGRAM_WINDOW_DEFAULTS = (2, 8)
# The runtime's --speculative-num-draft-tokens where spec.speculative leaves numDraftTokens out
DRAFT_TOKENS_DEFAULT = 4
_DRAFT_TOKENS = f"(has(self.numDraftTokens) ? self.numDraftTokens : {DRAFT_TOKENS_DEFAULT})"
# A tree of drafts (at `self`, spec.speculative): a breadth above 1 (the runtime's
# speculative_breadth); else the drafts are a chain
_TREE = ("((has({s}.eagleTopk) && {s}.eagleTopk > 1) || (has({s}.ngram) && "
         "has({s}.ngram.maxBfsBreadth) && {s}.ngram.maxBfsBreadth > 1))")
_PVC = "^pvc://[a-z0-9]([-a-z0-9]*[a-z0-9])?/.+$"
_HUB_ID = "^[A-Za-z0-9][-A-Za-z0-9_.]*/[-A-Za-z0-9_.]+$"

RULES: tuple[Rule, ...] = (
    Rule(
        "model.source",
        "!self.startsWith('pvc://') || self.matches('^pvc://[a-z0-9]([-a-z0-9]*[a-z0-9])?/.+$')",
        "a pvc source is pvc://CLAIM/path",
    ),
    # NOTE: the cache's type-specific fields have no defaults, so presence means the user set it.
    Rule(
        "model.cache",
        "self.type != 'sharedPVC' || has(self.claimName)",
        "type sharedPVC needs claimName",
    ),
    Rule(
        "model.cache",
        "self.type == 'sharedPVC' || (!has(self.claimName) && !has(self.readOnly))",
        "claimName and readOnly are for type sharedPVC",
    ),
    Rule(
        "model.cache",
        "self.type == 'pvcPerReplica' || (!has(self.size) && "
        "!has(self.storageClassName) && !has(self.accessModes))",
        "size, storageClassName and accessModes are for type pvcPerReplica",
    ),
    Rule(
        "model.cache",
        "self.type != 'pvcPerReplica' || has(self.size)",
        "type pvcPerReplica needs size",
    ),
    Rule(
        "model.cache",
        "self.type == 'emptyDir' || !has(self.sizeLimit)",
        "sizeLimit is for type emptyDir",
    ),
    Rule(
        "modelCache",
        "has(self.pvc) != has(self.emptyDir)",
        "set exactly one of pvc, emptyDir",
    ),
    Rule(
        "rollout",
        "self.strategy != 'RollingUpdate' || !has(self.maxSurge) || !has(self.maxUnavailable) || "
        f"!({_is_zero('self.maxSurge')} && {_is_zero('self.maxUnavailable')})",
        "maxSurge and maxUnavailable cannot both be zero",
    ),
    Rule(
        "template.metadata",
        f"!has(self.labels) || !self.labels.exists(k, k in {list(SELECTOR_LABEL_KEYS)!r})",
        f"the selector labels {', '.join(SELECTOR_LABEL_KEYS)} are the operator's",
    ),
    Rule(
        "template.spec.container",
        "!has(self.command) && !has(self.args)",
        "the server's command and args are the operator's: use spec.runtime (and "
        "spec.runtime.extraArgs for other flags)",
    ),
    Rule(
        "lora",
        "!has(self.adapters) || self.adapters.all(a, a.source.startsWith('/') || "
        f"a.source.matches('{_PVC}') || a.source.matches('{_HUB_ID}'))",
        "an adapter's source is a hub id (org/name), pvc://CLAIM/path or an absolute path",
        ".adapters",
    ),
    Rule(
        "",
        "!has(self.lora) || !has(self.lora.adapters) || !has(self.model.servedName) || "
        "!self.lora.adapters.exists(a, a.name == self.model.servedName)",
        "an adapter cannot take the model's servedName",
        ".lora.adapters",
    ),
    Rule(
        "speculative.draftModel.source",
        f"self.startsWith('/') || self.matches('{_PVC}') || self.matches('{_HUB_ID}')",
        "a draft model's source is a hub id (org/name), pvc://CLAIM/path or an absolute path",
    ),
    Rule(
        "speculative",
        "(self.algorithm == 'draft' || self.algorithm == 'eagle3') == has(self.draftModel)",
        "draftModel is needed by algorithms draft and eagle3, and only by them",
        ".draftModel",
    ),
    Rule(
        "speculative",
        "self.algorithm == 'ngram' || !has(self.ngram)",
        "ngram is for algorithm ngram",
        ".ngram",
    ),
    Rule(
        "speculative.ngram",
        f"(has(self.minMatchWindow) ? self.minMatchWindow : {NGRAM_WINDOW_DEFAULTS[0]}) <= "
        f"(has(self.maxMatchWindow) ? self.maxMatchWindow : {NGRAM_WINDOW_DEFAULTS[1]})",
        "minMatchWindow must not exceed maxMatchWindow (a bound left out is the runtime's: "
        f"min {NGRAM_WINDOW_DEFAULTS[0]}, max {NGRAM_WINDOW_DEFAULTS[1]})",
    ),
    Rule(
        "speculative",
        "self.algorithm != 'ngram' || !has(self.eagleTopk) || self.eagleTopk == 1",
        "eagleTopk above 1 branches a draft model's or an EAGLE-3 head's steps: it needs "
        "algorithm draft or eagle3 (ngram trees take ngram.maxBfsBreadth)",
        ".eagleTopk",
    ),
    Rule(
        "speculative",
        f"!has(self.numSteps) || self.numSteps <= {_DRAFT_TOKENS}",
        "numSteps must not exceed numDraftTokens, a path of the tree being at most all its nodes "
        f"(numDraftTokens left out is the runtime's {DRAFT_TOKENS_DEFAULT})",
        ".numSteps",
    ),
    Rule(
        "speculative",
        f"!has(self.numSteps) || self.numSteps == {_DRAFT_TOKENS} || {_TREE.format(s='self')}",
        "numSteps of a chain (eagleTopk and ngram.maxBfsBreadth absent or 1) is numDraftTokens "
        f"(left out, the runtime's {DRAFT_TOKENS_DEFAULT}): leave it out or make them equal",
        ".numSteps",
    ),
    Rule(
        "",
        "!has(self.speculative) || !has(self.runtime.pageSize) || self.runtime.pageSize == 1 || "
        f"!{_TREE.format(s='self.speculative')}",
        "a speculative tree (eagleTopk or ngram.maxBfsBreadth above 1) takes a KV slot a drafted "
        "node: it needs pageSize 1 (the runtime's default: leave it out)",
        ".runtime.pageSize",
    ),
    Rule(
        "",
        "!has(self.speculative) || !has(self.speculative.draftModel) || "
        "!has(self.model.revision) || self.speculative.draftModel.source.startsWith('/') || "
        "self.speculative.draftModel.source.startsWith('pvc://')",
        "a hub draftModel is read at model.revision (the pods' RADIXSERVE_MODEL_REVISION), which "
        "its repository rarely has: leave model.revision out, or give the draft model as "
        "pvc://CLAIM/path or a path",
        ".speculative.draftModel",
    ),
    Rule(
        "runtime.hierarchicalCache",
        "has(self.size) != has(self.ratio)",
        "set exactly one of size, ratio",
    ),
    Rule(
        "runtime",
        "!has(self.hierarchicalCache) || !has(self.cache) || self.cache == 'radix'",
        "hierarchicalCache keeps the radix cache's KV: it needs cache radix",
        ".hierarchicalCache",
    ),
    Rule(
        "autoscaling",
        "self.minReplicas <= self.maxReplicas",
        "minReplicas must not exceed maxReplicas",
    ),
    Rule(
        "autoscaling",
        "self.minReplicas > 0 || self.engine == 'keda'",
        "scale to zero (minReplicas 0) needs engine keda",
    ),
    Rule(
        "autoscaling",
        "self.metric != 'kvCache' || !has(self.target) || self.target <= 1.0",
        "a kvCache target is a ratio: at most 1",
    ),
    Rule(
        "",
        "string(self.parallelism.tensor) != 'auto' || !self.gpu.enabled || "
        "has(self.gpu.memoryGiB)",
        "parallelism.tensor auto needs gpu.memoryGiB",
        ".gpu",
    ),
    Rule(
        "",
        "!has(self.runtime.hierarchicalCache) || has(self.runtime.hierarchicalCache.size) || "
        "!self.gpu.enabled || has(self.gpu.memoryGiB)",
        "runtime.hierarchicalCache without size grows the pod's memory by ratio x memoryRatio x "
        "gpu.memoryGiB: set gpu.memoryGiB, or give hierarchicalCache.size",
        ".runtime.hierarchicalCache",
    ),
    Rule(
        "",
        "self.gpu.enabled || string(self.parallelism.tensor) in ['1', 'auto']",
        "a CPU replica (gpu.enabled false) runs with tensor parallelism 1",
        ".parallelism.tensor",
    ),
    Rule(
        "",
        "!has(self.model.cache) || self.model.cache.type != 'pvcPerReplica' || "
        "(self.rollout.strategy == 'RollingUpdate' && "
        f"(!has(self.rollout.maxSurge) || {_is_zero('self.rollout.maxSurge')}) && "
        f"(!has(self.rollout.maxUnavailable) || !({_is_zero('self.rollout.maxUnavailable')})))",
        PER_REPLICA_ROLLOUT,
        ".rollout",
    ),
    Rule(
        "",
        "!has(self.template) || !has(self.template.spec) || !has(self.template.spec.container) || "
        f"!has({_RESOURCES}) || "
        f"((!has({_RESOURCES}.limits) || !(self.gpu.resourceName in {_RESOURCES}.limits)) && "
        f"(!has({_RESOURCES}.requests) || !(self.gpu.resourceName in {_RESOURCES}.requests)))",
        "the GPU count is the operator's (parallelism.tensor): remove gpu.resourceName from "
        "template.spec.container.resources",
        ".template",
    ),
    Rule(
        ROOT,
        f"size(self.metadata.name) <= {NAME_MAX} && "
        "self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",
        "metadata.name must be a DNS-1035 label, as the Service it names: lower-case letters, "
        f"digits and '-', starting with a letter, at most {NAME_MAX} characters",
    ),
    Rule(
        ROOT,
        f"!self.spec.router.enabled || size(self.metadata.name) <= {NAME_MAX - len(ROUTER_SUFFIX)}",
        f"metadata.name is at most {NAME_MAX - len(ROUTER_SUFFIX)} characters with router.enabled: "
        f"the router's Service is NAME{ROUTER_SUFFIX}",
    ),
    Rule(
        ROOT,
        "!has(self.spec.model.cache) || self.spec.model.cache.type != 'pvcPerReplica' || "
        f"size(self.metadata.name) <= {STATEFULSET_NAME_MAX}",
        f"metadata.name is at most {STATEFULSET_NAME_MAX} characters with model.cache type "
        "pvcPerReplica: the StatefulSet labels its pods NAME-<revision hash> (a label value: at "
        "most 63)",
    ),
)


def validations(path: str) -> dict[str, Any]:
    """The schema keys that carry the rules at `path` (none: no key), for `crd.py`."""
    here = [r.validation() for r in RULES if r.path == path]
    return {"x-kubernetes-validations": here} if here else {}


@functools.cache
def _program(expression: str) -> celpy.Runner:
    env = celpy.Environment()
    return env.program(env.compile(expression))


def _typed(schema: dict[str, Any], value: Any) -> Any:
    """`value` as CEL sees it under `schema`: nulls pruned, a `number` a double."""
    if isinstance(value, dict):
        props, extra = schema.get("properties") or {}, schema.get("additionalProperties")
        extra = extra if isinstance(extra, dict) else {}
        return celtypes.MapType(
            {
                celtypes.StringType(k): _typed(props.get(k) or extra, v)
                for k, v in value.items()
                if v is not None
            }
        )
    if isinstance(value, list):
        return celtypes.ListType([_typed(schema.get("items") or {}, v) for v in value])
    if schema.get("type") == "number" and isinstance(value, int) and not isinstance(value, bool):
        return celtypes.DoubleType(value)
    return celpy.json_to_cel(value)


def _at(spec: dict[str, Any], schema: dict[str, Any], path: str) -> tuple[Any, dict[str, Any]]:
    """The value at `path` under spec and its schema; (None, {}) where the value is absent."""
    value: Any = spec
    for key in filter(None, path.split(".")):
        if not isinstance(value, dict) or value.get(key) is None:
            return None, {}
        value, schema = value[key], (schema.get("properties") or {}).get(key) or {}
    return value, schema


def violations(
    spec: dict[str, Any], schema: dict[str, Any], name: str | None = None
) -> list[str]:
    """What each rule that `spec` (defaulted, under the CRD's `schema` of spec) breaks says, after
    the field it names; empty when it breaks none. The rules on the resource itself (ROOT) run
    when its `name` is given."""
    out = []
    for r in RULES:
        if r.path == ROOT:
            if name is None:
                continue
            value: Any = {"metadata": {"name": name}, "spec": spec}
            node: dict[str, Any] = {"properties": {"spec": schema}}
        else:
            value, node = _at(spec, schema, r.path)
        if value is None:
            continue
        try:
            ok = bool(_program(r.rule).evaluate({"self": _typed(node, value)}))
        except celpy.CELEvalError as e:  # the API server refuses what its rule cannot judge
            out.append(f"{r.field}: {r.message} (the rule could not be evaluated: {e.args[0]})")
            continue
        if not ok:
            got = f", got {value!r}" if isinstance(value, (str, int, float)) else ""
            out.append(f"{r.field}: {r.message}{got}" if r.field else r.message)
    return out
