"""Which build of the pure core runs: its modules compiled by mypyc, or their Python sources.

`pip install` compiles `COMPILED_MODULES` with mypyc and `NATIVE_MODULES` from their C where it
can (setup.py) and records a digest of each source it compiled in `DIGESTS_FILE` beside them. The
package's `__init__` calls `select` before any of them is imported, and the Python sources run
instead of the compiled copies when:

- `STREAM_NDCG_PURE=1` asks for them (the pure engine stays the reference: tests run under both);
- no compiled copy is installed (no C compiler, or the build failed: the install fell back);
- a source no longer matches its recorded digest: an editable install whose `engine.py` was
  edited after the build would otherwise run the stale compiled copy; it says so on stderr.

The compiled modules of one mypyc group call each other directly, so the whole set is switched
together: a finder ahead of the others on `sys.meta_path` loads each of them from its `.py`. A C
module has no `.py`: the pure core's module it serves runs its own Python instead
(`list_squares` and `squares_kernel`).

    build = core_build()
    build.core, build.reason  # ("pure", "STREAM_NDCG_PURE=1") or ("compiled", "")
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import logging
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

logger = logging.getLogger(__name__)

# The typed modules of the pure core that only import the standard library and each other.
# query_state stays out: the stores' caches take weak references to its Group and QueryState,
# which a native class of this mypyc refuses (docs/installation.md says more).
COMPILED_MODULES = ("vocabulary", "metric", "window_sums", "list_squares", "group_sums", "stored_lists",
                    "list_terms", "rows", "windows", "engine")
# Modules of the compiled core written in C, each from its `.c` beside the package's sources: the
# Python they stand for stays in the pure core's modules, which load them only when compiled.
NATIVE_MODULES = ("squares_kernel",)
BUILT_MODULES = COMPILED_MODULES + NATIVE_MODULES
# How setup.py compiles them: the typed modules as one mypyc group (its modules call each other
# directly), at -O3; the C modules with IEEE arithmetic as written (no fused multiply-adds).
GROUP_NAME = "stream_ndcg.core"
OPT_LEVEL = "3"
NATIVE_COMPILE_ARGS = ("-O2", "-ffp-contract=off")
PURE_VARIABLE = "STREAM_NDCG_PURE"
DIGESTS_FILE = "compiled_sources.json"

PACKAGE = "stream_ndcg"
PACKAGE_DIR = Path(__file__).resolve().parent


@dataclass(frozen=True)
class CoreBuild:
    """The build of the pure core this process runs, and why it is pure when it is."""

    core: Literal["compiled", "pure"]
    reason: str = ""

    def describe(self) -> str:
        """One line for the start-up log and `--version`."""
        return "compiled core (mypyc)" if self.core == "compiled" else f"pure-Python core ({self.reason})"


def source_digest(path: Path) -> str:
    """What the build records of a source it compiled, and what an import compares."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def source_of(name: str) -> str:
    """The file a module of the compiled core is built from."""
    return f"{name}.c" if name in NATIVE_MODULES else f"{name}.py"


def source_digests(package_dir: Path) -> dict[str, str]:
    """What a build records beside the modules it compiled: each one's source's digest."""
    return {name: source_digest(package_dir / source_of(name)) for name in BUILT_MODULES}


def native_extensions() -> list[dict[str, Any]]:
    """The arguments of a setuptools `Extension` for each of `NATIVE_MODULES`: what setup.py and the
    benches' compiled copies build them with."""
    return [{"name": f"{PACKAGE}.{name}", "sources": [f"{PACKAGE}/{name}.c"],
             "extra_compile_args": list(NATIVE_COMPILE_ARGS)} for name in NATIVE_MODULES]


def compiled_copies(package_dir: Path) -> list[Path]:
    """The compiled modules installed beside the sources (extension suffixes of this interpreter)."""
    return [package_dir / f"{name}{suffix}" for name in BUILT_MODULES
            for suffix in importlib.machinery.EXTENSION_SUFFIXES if (package_dir / f"{name}{suffix}").exists()]


def choose(package_dir: Path, environ: Mapping[str, str]) -> CoreBuild:
    """The build to run: compiled unless asked for pure, not installed, or stale."""
    if environ.get(PURE_VARIABLE, "") not in ("", "0"):
        return CoreBuild("pure", f"{PURE_VARIABLE}={environ[PURE_VARIABLE]}")
    installed = compiled_copies(package_dir)
    if not installed:
        return CoreBuild("pure", "no compiled build installed")
    if len(installed) != len(BUILT_MODULES):
        return CoreBuild("pure", f"compiled build incomplete: {len(installed)} of {len(BUILT_MODULES)} modules")
    try:
        recorded = json.loads((package_dir / DIGESTS_FILE).read_text())
    except (OSError, ValueError):
        return CoreBuild("pure", f"{DIGESTS_FILE} missing or unreadable beside the compiled modules")
    try:
        digests = source_digests(package_dir)
    except OSError as error:
        return CoreBuild("pure", f"a compiled module's source is missing ({error.filename})")
    stale = [name for name, digest in digests.items() if recorded.get(name) != digest]
    if stale:
        return CoreBuild("pure", "compiled build stale, source changed since: "
                         + ", ".join(source_of(name) for name in stale) + " (rebuild: pip install -e . or make venv)")
    return CoreBuild("compiled")


class SourceFinder(importlib.abc.MetaPathFinder):
    """Finds the compiled set's modules as their `.py` sources, ahead of the extension modules."""

    def __init__(self, package_dir: Path) -> None:
        self.package_dir = package_dir
        self.names = {f"{PACKAGE}.{name}": name for name in COMPILED_MODULES}

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        name = self.names.get(fullname)
        if name is None:
            return None
        return importlib.util.spec_from_file_location(fullname, self.package_dir / f"{name}.py")


_selected = CoreBuild("pure", "not selected yet")


def select(environ: Mapping[str, str], package_dir: Path = PACKAGE_DIR) -> CoreBuild:
    """Choose the build and, when pure while compiled copies are installed, load the sources instead.

    Called once by the package's `__init__`, before any module of the compiled set is imported."""
    global _selected
    _selected = choose(package_dir, environ)
    if _selected.core == "pure" and compiled_copies(package_dir):
        sys.meta_path[:] = [SourceFinder(package_dir),
                            *(finder for finder in sys.meta_path if not isinstance(finder, SourceFinder))]
        if not _selected.reason.startswith(PURE_VARIABLE):
            # Before logging is set up, Python's last-resort handler prints this on stderr.
            logger.warning("stream-ndcg runs its %s", _selected.describe())
    return _selected


def core_build() -> CoreBuild:
    """The build of the pure core this process runs."""
    return _selected
