"""The settings as a person meets them: their flags, their `--help` lines and the table of
docs/configuration.md, all made from the declarations in `config` (`python -m
stream_ndcg.setting_flags` prints the table)."""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Mapping
from dataclasses import fields

from stream_ndcg import setting_values as values
from stream_ndcg.config import Settings, env_name, flag_name
from stream_ndcg.setting_fields import DURATION


def shown_default(name: str) -> str:
    """A setting's default as a person writes it: 5m not 300000, 5,10 not (5, 10)."""
    spec = Settings.specs()[name]
    value = next(f.default for f in fields(Settings) if f.name == name)
    if spec.shown_default:
        return spec.shown_default
    items = value if isinstance(value, tuple) else (value,)
    if spec.metavar.startswith(DURATION):
        items = tuple(values.format_duration(v) for v in items)
    return ",".join(str(v).lower() if isinstance(v, bool) else str(v) for v in items)


def help_line(name: str, *, variable: bool = True) -> str:
    """The one line of `--help` for a setting: meaning, default, allowed values, and its variable
    (not for a command that reads flags only)."""
    spec = Settings.specs()[name]
    parts = [spec.help]
    default = shown_default(name)
    parts.append(f"default {default}" if default else "default empty")
    if spec.choices:
        parts.append(f"one of {', '.join(spec.choices)}")
    if variable:
        parts.append(f"env {env_name(name)}")
    return "; ".join(parts)


def add_setting_flags(parser: argparse._ActionsContainer, names: Iterable[str], *, variables: bool = True,
                      flags: Mapping[str, str] | None = None) -> None:
    """One flag per setting, from its declaration: its name (or `flags`' other name for it), value
    and help. Values stay text here: `Settings.load` checks them and names the flag in its message."""
    specs = Settings.specs()
    for name in names:
        parser.add_argument((flags or {}).get(name, flag_name(name)), dest=name, metavar=specs[name].metavar,
                            help=help_line(name, variable=variables))


def markdown_table() -> str:
    """The settings table of docs/configuration.md, generated from the declarations."""
    rows = ["| setting | default | meaning |", "|---|---|---|"]
    for name, spec in Settings.specs().items():
        default = shown_default(name)
        shown = f"`{default}`" if default and not spec.shown_default else default
        meaning = spec.help + (f" (one of {', '.join(f'`{c}`' for c in spec.choices)})" if spec.choices else "")
        rows.append(f"| `{name}` | {shown} | {meaning} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(markdown_table(), end="")
