"""The build of the pure core: the one running is the one it says; STREAM_NDCG_PURE selects the
Python sources even where the compiled copies are installed; a compiled copy whose source changed
since its build never runs; and a package without compiled copies runs pure and says why."""

from __future__ import annotations

import importlib
import importlib.machinery
import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from stream_ndcg import core_build as build_module
from stream_ndcg.core_build import (
    BUILT_MODULES,
    COMPILED_MODULES,
    DIGESTS_FILE,
    NATIVE_MODULES,
    PACKAGE_DIR,
    PURE_VARIABLE,
    CoreBuild,
    SourceFinder,
    choose,
    compiled_copies,
    core_build,
    select,
    source_digests,
    source_of,
)

COMPILED_INSTALLED = bool(compiled_copies(PACKAGE_DIR))


def _origin(name: str) -> str:
    module = importlib.import_module(f"stream_ndcg.{name}")
    return str(module.__file__)


def test_the_modules_running_are_those_of_the_build_it_says() -> None:
    build = core_build()
    for name in COMPILED_MODULES:
        origin = _origin(name)
        if build.core == "pure":
            assert origin.endswith(f"{name}.py"), origin
        else:
            assert origin.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)), origin
    # The pure core's list_squares runs its own loops; the compiled one loads the C kernel.
    from stream_ndcg import list_squares
    assert (build.core == "compiled") == hasattr(list_squares, "squares_kernel")


def test_the_variable_selects_the_pure_build() -> None:
    if os.environ.get(PURE_VARIABLE) == "1":
        assert core_build() == CoreBuild("pure", f"{PURE_VARIABLE}=1")
        assert all(_origin(name).endswith(".py") for name in COMPILED_MODULES)
    assert choose(PACKAGE_DIR, {PURE_VARIABLE: "1"}) == CoreBuild("pure", f"{PURE_VARIABLE}=1")


def _version(pure: bool) -> str:
    environ = {key: value for key, value in os.environ.items() if key != PURE_VARIABLE}
    if pure:
        environ[PURE_VARIABLE] = "1"
    return subprocess.run([sys.executable, "-m", "stream_ndcg.cli", "--version"], env=environ, check=True,
                          capture_output=True, text=True, timeout=60).stdout


@pytest.mark.skipif(not COMPILED_INSTALLED, reason="no compiled build installed (no C compiler, or a pure install)")
def test_where_the_compiled_build_is_installed_it_runs_unless_the_variable_says_pure() -> None:
    assert "compiled core (mypyc)" in _version(pure=False)
    assert f"pure-Python core ({PURE_VARIABLE}=1)" in _version(pure=True)


def _package_copy(tmp_path: Path, digests: bool = True) -> Path:
    """The compiled set's sources, a stand-in for each compiled copy, and the build's digests."""
    for name in BUILT_MODULES:
        shutil.copy(PACKAGE_DIR / source_of(name), tmp_path / source_of(name))
        (tmp_path / f"{name}{importlib.machinery.EXTENSION_SUFFIXES[0]}").write_bytes(b"")
    if digests:
        (tmp_path / DIGESTS_FILE).write_text(json.dumps(source_digests(tmp_path)))
    return tmp_path


def test_a_build_matching_its_sources_runs_compiled(tmp_path: Path) -> None:
    package = _package_copy(tmp_path)
    assert choose(package, {}) == CoreBuild("compiled")
    assert choose(package, {PURE_VARIABLE: "0"}) == CoreBuild("compiled")


def test_a_source_edited_after_the_build_makes_the_whole_set_run_pure(tmp_path: Path) -> None:
    package = _package_copy(tmp_path)
    with (package / "engine.py").open("a") as source:
        source.write("\n# an edit\n")
    build = choose(package, {})
    assert build.core == "pure"
    assert "stale" in build.reason and "engine.py" in build.reason and "metric.py" not in build.reason


def test_a_build_installed_without_a_source_it_compiled_runs_pure(tmp_path: Path) -> None:
    package = _package_copy(tmp_path)
    (native,) = NATIVE_MODULES
    (package / f"{native}.c").unlink()
    build = choose(package, {})
    assert build.core == "pure" and "missing" in build.reason and f"{native}.c" in build.reason


def test_a_c_source_edited_after_the_build_makes_the_whole_set_run_pure(tmp_path: Path) -> None:
    package = _package_copy(tmp_path)
    (native,) = NATIVE_MODULES
    with (package / f"{native}.c").open("a") as source:
        source.write("\n/* an edit */\n")
    build = choose(package, {})
    assert build.core == "pure" and f"{native}.c" in build.reason and "engine.py" not in build.reason
    (package / f"{native}{importlib.machinery.EXTENSION_SUFFIXES[0]}").unlink()
    assert "incomplete" in choose(package, {}).reason


def test_compiled_copies_without_their_digests_or_not_all_of_them_run_pure(tmp_path: Path) -> None:
    package = _package_copy(tmp_path, digests=False)
    assert choose(package, {}).core == "pure" and DIGESTS_FILE in choose(package, {}).reason
    (package / DIGESTS_FILE).write_text("{")
    assert choose(package, {}).core == "pure"
    (package / DIGESTS_FILE).unlink()
    _package_copy(package)
    (package / f"rows{importlib.machinery.EXTENSION_SUFFIXES[0]}").unlink()
    assert choose(package, {}) == CoreBuild("pure", f"compiled build incomplete: {len(BUILT_MODULES) - 1} "
                                                    f"of {len(BUILT_MODULES)} modules")


def test_a_package_without_compiled_copies_runs_pure(tmp_path: Path) -> None:
    for name in COMPILED_MODULES:
        shutil.copy(PACKAGE_DIR / f"{name}.py", tmp_path / f"{name}.py")
    assert choose(tmp_path, {}) == CoreBuild("pure", "no compiled build installed")


def test_a_stale_build_puts_the_sources_first_and_says_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    monkeypatch.setattr(build_module, "_selected", core_build())
    package = _package_copy(tmp_path)
    with (package / "metric.py").open("a") as source:
        source.write("\n# an edit\n")
    with caplog.at_level(logging.WARNING, logger="stream_ndcg.core_build"):
        build = select({}, package)
    assert build.core == "pure" and core_build() == build
    assert isinstance(sys.meta_path[0], SourceFinder) and sys.meta_path[0].package_dir == package
    assert "metric.py" in caplog.text and "pure-Python core" in caplog.text


def test_the_source_finder_loads_the_compiled_set_from_its_sources_and_nothing_else() -> None:
    finder = SourceFinder(PACKAGE_DIR)
    for name in COMPILED_MODULES:
        spec = finder.find_spec(f"stream_ndcg.{name}", None)
        assert spec is not None and spec.origin == str(PACKAGE_DIR / f"{name}.py")
        assert isinstance(spec.loader, importlib.machinery.SourceFileLoader)
    assert finder.find_spec("stream_ndcg.query_state", None) is None
    assert finder.find_spec("stream_ndcg.events", None) is None


def test_the_makefile_rebuilds_the_venv_when_a_compiled_source_changes() -> None:
    makefile = (PACKAGE_DIR.parent / "Makefile").read_text()
    (modules,) = [line.split(":=")[1].split() for line in makefile.splitlines() if line.startswith("CORE_MODULES :=")]
    assert tuple(modules) == COMPILED_MODULES
    (native,) = [line.split(":=")[1].split() for line in makefile.splitlines() if line.startswith("NATIVE_MODULES :=")]
    assert tuple(native) == NATIVE_MODULES
    assert "$(STAMP): pyproject.toml setup.py $(CORE_SOURCES)" in makefile
