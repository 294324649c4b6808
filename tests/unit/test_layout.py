"""The package's shape: no import circle between its modules, the pure core on the standard
library alone, no module over 400 lines, and the old import paths still there for one release."""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "stream_ndcg"
# The modules whose import path users may hold, moved into subpackages, re-exported for one release.
DEPRECATED = {"stream_ndcg.store": ("StateStore", "MemoryStore", "Commit"),
              "stream_ndcg.redis_store": ("RedisStore", "connect"),
              "stream_ndcg.replay": ("Replay",)}
PURE_CORE = ("vocabulary", "metric", "decoding", "events", "query_state", "rows", "engine", "windows",
             "window_sums", "click_sessions", "click_models", "click_state", "click_judge", "comparisons",
             "ubi", "list_squares", "experiments", "group_sums", "list_terms", "core_build")
# The compiled core's C modules (`core_build.NATIVE_MODULES`): the Python C API alone, loaded by the
# pure core's modules only when the compiled core runs.
NATIVE_CORE = ("squares_kernel",)
# The one library the core may use: the parser decodes the usual message with orjson, and leaves
# every other to the standard library's decoder (`decoding`).
CORE_LIBRARIES = {"decoding": {"orjson"}}
MAX_LINES = 400


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """The modules of the package that `path` imports, at run time (TYPE_CHECKING blocks too: a circle
    there is a circle of knowledge all the same)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                found.add(submodule if (PACKAGE.parent / submodule.replace(".", "/")).with_suffix(".py").exists()
                          or (PACKAGE.parent / submodule.replace(".", "/")).is_dir() else node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name == "stream_ndcg" or name.startswith("stream_ndcg.")}


def graph() -> dict[str, set[str]]:
    modules = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    return {name: {imported for imported in imports_of(path) if imported in modules and imported != name}
            for name, path in modules.items() if name not in DEPRECATED}


def find_circle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import circle of the graph, as the modules round it, or None."""
    state: dict[str, str] = {}

    def visit(name: str, trail: list[str]) -> list[str] | None:
        state[name] = "open"
        for imported in sorted(edges.get(name, ())):
            if state.get(imported) == "open":
                return [*trail[trail.index(imported):], imported]
            if imported not in state and (circle := visit(imported, [*trail, imported])):
                return circle
        state[name] = "done"
        return None

    for name in sorted(edges):
        if name not in state and (circle := visit(name, [name])):
            return circle
    return None


def test_no_module_imports_itself_round_a_circle() -> None:
    edges = graph()
    # What the check reads: the moved modules and their arrows down.
    assert "stream_ndcg.query_state" in edges["stream_ndcg.rows"]
    assert "stream_ndcg.rows" in edges["stream_ndcg.engine"]
    assert find_circle(edges) is None, " -> ".join(find_circle(edges) or [])


def test_the_check_finds_a_circle_through_several_modules() -> None:
    edges = graph()
    edges["stream_ndcg.query_state"] = {*edges["stream_ndcg.query_state"], "stream_ndcg.engine"}
    circle = find_circle(edges)
    assert circle is not None and circle[0] == circle[-1] and "stream_ndcg.engine" in circle


@pytest.mark.parametrize("name", PURE_CORE)
def test_the_pure_core_imports_only_the_standard_library_and_itself(name: str) -> None:
    tree = ast.parse((PACKAGE / f"{name}.py").read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        modules = ([node.module or ""] if isinstance(node, ast.ImportFrom)
                   else [alias.name for alias in node.names] if isinstance(node, ast.Import) else [])
        for module in modules:
            top = module.split(".")[0]
            assert top in sys.stdlib_module_names or top in CORE_LIBRARIES.get(name, set()) \
                or module in {f"stream_ndcg.{m}" for m in PURE_CORE + NATIVE_CORE}, f"{name} imports {module}"


def test_no_module_is_over_the_line_limit() -> None:
    long = {str(path.relative_to(PACKAGE)): count for path in PACKAGE.rglob("*.py")
            if (count := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, long


@pytest.mark.parametrize("old", sorted(DEPRECATED))
def test_an_old_import_path_still_works_and_says_where_to_go(old: str) -> None:
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match="deprecated"):
        module = importlib.import_module(old)
    for name in DEPRECATED[old]:
        assert getattr(module, name) is not None
