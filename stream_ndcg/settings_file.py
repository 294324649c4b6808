"""A TOML settings file read for `config.Settings.load`: its keys, checked against the known settings.

    read_toml("stream-ndcg.toml", Settings.names())   # {"batch_size": 500, ...}
"""

from __future__ import annotations

import difflib
import tomllib
from typing import Any

from stream_ndcg.errors import ConfigError


def suggest(unknown: set[str], known: list[str]) -> str:
    close = {name: difflib.get_close_matches(name, known, n=1) for name in sorted(unknown)}
    hints = [f"{name} -> {match[0]}" for name, match in close.items() if match]
    return f" (did you mean: {', '.join(hints)}?)" if hints else ""


def read_toml(path: str, known: list[str]) -> dict[str, Any]:
    """The settings of a TOML file: keys at top level or all under [stream_ndcg], never both."""
    try:
        with open(path, "rb") as stream:
            document = tomllib.load(stream)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from None
    if "stream_ndcg" in document:
        others = sorted(set(document) - {"stream_ndcg"})
        if others:
            raise ConfigError(f"config file {path}: keys at top level ({', '.join(others)}) beside a "
                              "[stream_ndcg] table would be ignored: put every setting in one of the two")
        document = document["stream_ndcg"]
        if not isinstance(document, dict):
            raise ConfigError(f"config file {path}: stream_ndcg must be a table of settings")
    unknown = set(document) - set(known)
    if unknown:
        raise ConfigError(f"config file {path}: unknown key(s) {', '.join(sorted(unknown))}"
                          f"{suggest(unknown, known)}; `stream-ndcg check-config --help` lists the settings")
    return dict(document)
