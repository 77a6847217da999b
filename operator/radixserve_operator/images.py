"""Which images a resource may run: an image reference's grammar (the distribution reference
format), and the operator's optional allow-list of registry prefixes (`--allowed-registries`,
the chart's `security.allowedRegistries`; empty: any registry).

A prefix matches at a path boundary: `registry.example.com/team` allows
`registry.example.com/team/model:1` but not `registry.example.com/team-evil/model`. Images are
matched as written, never expanded (`ubuntu` is not read as `docker.io/library/ubuntu`), as the
chart's admission policy matches them; the grammar admits no `..` or empty path component."""

from __future__ import annotations

import re
from typing import Any

from radixserve_operator.settings import OperatorSettings
from radixserve_operator.spec import SpecError
from radixserve_operator.status import IMAGE_NOT_ALLOWED

_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DOMAIN = r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*(?::[0-9]+)?/)?"
REFERENCE = re.compile(
    rf"^{_DOMAIN}{_COMPONENT}(?:/{_COMPONENT})*(?::[A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}})?"
    r"(?:@sha256:[0-9a-f]{64})?$"
)


class ImageNotAllowed(SpecError):
    """An image outside the operator's allow-list, or not an image reference."""

    reason = IMAGE_NOT_ALLOWED


def registry_allowed(image: str, prefixes: tuple[str, ...]) -> bool:
    """Whether `image` starts with one of `prefixes` at a `/` boundary (none: any image)."""
    if not prefixes:
        return True
    return any(image.startswith(p if p.endswith("/") else p + "/") for p in prefixes)


def resource_images(raw_spec: dict[str, Any]) -> dict[str, str]:
    """The images a resource names, by field: spec.image, spec.router.image."""
    found = {"spec.image": raw_spec.get("image"),
             "spec.router.image": (raw_spec.get("router") or {}).get("image")}
    return {field: str(image) for field, image in found.items() if image}


def check_images(raw_spec: dict[str, Any], settings: OperatorSettings) -> None:
    """Each image the resource names is a reference and, with an allow-list, under one of its
    prefixes. The operator's own default images are its admin's and are not judged."""
    for field, image in resource_images(raw_spec).items():
        if len(image) > 512 or not REFERENCE.match(image):
            raise ImageNotAllowed(f"{field}: not an image reference: {image[:80]!r}")
        if not registry_allowed(image, settings.allowed_registries):
            raise ImageNotAllowed(
                f"{field}: image {image!r} is not under the operator's allowed registries "
                f"({', '.join(settings.allowed_registries)}; chart value "
                "security.allowedRegistries)"
            )
