"""A message's JSON object, decoded by the contract's encoding rules: how `events` reads a message.

Standard library, and orjson for the usual message. `strict_object` applies every rule
with the standard library's decoder (valid UTF-8, no NaN or Infinity, no key twice, no
unpaired surrogate escape; the caller checks the size and the byte order mark first);
`plain_object` decodes the usual message with orjson when it can tell the strict decoder would
find the same object, and otherwise leaves the message to it. `Invalid` carries a rejection's reason and detail up to
`events.parse_event`, which turns it into an `InvalidEvent`.
"""

from __future__ import annotations

import json
from typing import Any

import orjson


class Invalid(Exception):
    """Why a message breaks the contract: a bounded `reason` code and a `detail` in words."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.detail = detail


class _DuplicateKey(ValueError):
    pass


def _reject_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise _DuplicateKey(key)
        obj[key] = value
    return obj


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


_decoder = json.JSONDecoder(object_pairs_hook=_reject_duplicate_keys, parse_constant=_reject_constant)


# A message with more '[' than this (within strings or not) is decoded by the strict decoder
# alone: arrays nested that deep stop it (RecursionError, "nested too deeply") well before
# orjson's limit of 1024.
PLAIN_BRACKETS = 32


def plain_object(raw: bytes | str, colons: int) -> dict[str, Any] | None:
    """The message's object decoded by orjson, when the strict decoder would find the same; None
    when it must decide. The usual message takes half the time this way.

    Every colon outside a string ends a key, so a message with exactly as many `colons` as its
    object, its segment and its evidence have keys has no other objects, no colons within strings
    and no key twice (a repeated key would leave fewer keys than colons). Its caller leaves deep
    arrays to the strict decoder, whose recursion ends below orjson's depth limit. orjson itself refuses
    what else the strict decoder refuses: invalid UTF-8, NaN and Infinity, an unpaired surrogate
    escape (`test_events` holds the installed orjson to that)."""
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if type(obj) is not dict:
        return None
    keys = len(obj)
    # Unrolled: a tuple of the two built and walked for every message cost more than the look-ups.
    segment, evidence = obj.get("segment"), obj.get("evidence")
    if type(segment) is dict:
        keys += len(segment)
    if type(evidence) is dict:
        keys += len(evidence)
    return obj if colons == keys else None


def strict_object(raw: bytes | str) -> dict[str, Any]:
    """The message's object, or why it is not one: every rule of JSON and of the contract's
    encoding, checked by the standard library's decoder."""
    if isinstance(raw, bytes):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise Invalid("not_utf8", str(exc)) from None
    else:
        try:
            # A str from Python may hold a lone surrogate itself, not just its JSON escape.
            raw.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise Invalid("not_utf8", str(exc)) from None
        text = raw
    try:
        obj = _decoder.decode(text)
    except _DuplicateKey as exc:
        raise Invalid("duplicate_key", f"key {exc} appears twice") from None
    except ValueError as exc:
        raise Invalid("not_json", str(exc)) from None
    if not isinstance(obj, dict):
        raise Invalid("not_object", f"JSON {type(obj).__name__}, not an object")
    if ("\\ud" in text or "\\uD" in text) and _has_lone_surrogate(obj):
        # "\ud800" is valid JSON but no UTF-8 string: nothing downstream could store it.
        raise Invalid("invalid_string", "a string holds an unpaired UTF-16 surrogate escape")
    return obj


def _has_lone_surrogate(value: Any) -> bool:
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return True
        return False
    if isinstance(value, dict):
        return any(_has_lone_surrogate(k) or _has_lone_surrogate(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_lone_surrogate(item) for item in value)
    return False
