"""The chart's ValidatingAdmissionPolicy judged as the API server judges it, with cel-python (CEL
outside an API server): match conditions, then the variables in order, then each validation; a
validation that is not true denies with its messageExpression (its message when that fails).
The InferenceService is defaulted from the CRD schema first, as the API server does before
admission."""

from __future__ import annotations

import copy
from typing import Any

import celpy
from celpy import celtypes

from radixserve_operator.crd import spec_schema
from radixserve_operator.spec import apply_defaults


class ExpressionError(AssertionError):
    """An expression failed to compile or evaluate: the API server would deny with an error."""


def _evaluate(env: celpy.Environment, expression: str, activation: dict[str, Any]) -> Any:
    try:
        return env.program(env.compile(expression)).evaluate(activation)
    except (celpy.CELParseError, celpy.CELEvalError) as e:
        raise ExpressionError(f"{expression!r}: {e}") from e


def defaulted(obj: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    out["spec"] = apply_defaults(spec_schema(), out.get("spec") or {})
    return out


def admit(
    policy: dict[str, Any],
    obj: dict[str, Any],
    old: dict[str, Any] | None = None,
    operation: str = "CREATE",
) -> list[str] | None:
    """None when the policy's match conditions leave the request alone; else the denial
    messages (empty: admitted)."""
    env = celpy.Environment()
    spec = policy["spec"]
    activation: dict[str, Any] = {
        "object": celpy.json_to_cel(defaulted(obj)),
        "oldObject": celpy.json_to_cel(defaulted(old)) if old is not None else None,
        "request": celpy.json_to_cel({"operation": operation}),
    }
    for condition in spec.get("matchConditions") or ():
        if not bool(_evaluate(env, condition["expression"], activation)):
            return None
    variables: dict[str, Any] = {}
    for var in spec.get("variables") or ():
        activation["variables"] = celtypes.MapType(
            {celtypes.StringType(k): v for k, v in variables.items()}
        )
        variables[var["name"]] = _evaluate(env, var["expression"], activation)
    activation["variables"] = celtypes.MapType(
        {celtypes.StringType(k): v for k, v in variables.items()}
    )
    denials = []
    for rule in spec["validations"]:
        if bool(_evaluate(env, rule["expression"], activation)):
            continue
        message = rule.get("message", "")
        if "messageExpression" in rule:
            message = str(_evaluate(env, rule["messageExpression"], activation))
        denials.append(message)
    return denials
