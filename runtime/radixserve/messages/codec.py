"""A small generic msgpack codec for typed dataclass messages: every registered dataclass travels
as a map with a type tag and its fields, so nothing is ever pickled across processes."""
from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

import msgpack

_TAG = "__t"
_TYPES: dict[str, type] = {}
T = TypeVar("T")


def message(cls: type[T]) -> type[T]:
    """Class decorator: make `cls` encodable (it must be a dataclass)."""
    assert dataclasses.is_dataclass(cls), f"{cls.__name__} must be a dataclass"
    assert cls.__name__ not in _TYPES, f"duplicate message type {cls.__name__}"
    _TYPES[cls.__name__] = cls
    return cls


def _plain(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        name = type(obj).__name__
        assert _TYPES.get(name) is type(obj), f"{name} is not a registered message"
        out = {f.name: _plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
        out[_TAG] = name
        return out
    if isinstance(obj, (list, tuple)):
        return [_plain(x) for x in obj]
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    return obj


def _revive(d: dict) -> Any:
    name = d.pop(_TAG, None)
    if name is None:
        return d
    cls = _TYPES.get(name)
    if cls is None:
        raise ValueError(f"unknown message type {name!r}")
    return cls(**d)


def encode(obj: Any) -> bytes:
    return msgpack.packb(_plain(obj), use_bin_type=True)


def decode(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False, object_hook=_revive, strict_map_key=False)


def register_external(cls: type) -> None:
    """Register a dataclass defined elsewhere (e.g. `SamplingParams`) without decorating it."""
    if _TYPES.get(cls.__name__) is not cls:
        message(cls)
