"""A copy of the package with its core compiled in place as setup.py compiles it: what a bench sets
against the installed build when it changes the core's sources (the squares bench cuts them out).

    package = compiled_copy(Path(tmp), edit=cut)   # tmp/stream_ndcg, `cut(tmp / "stream_ndcg")` first
    # a child process with PYTHONPATH=tmp imports it: check its __file__, the installed tree is on the path too

    python -m bench.harness.compiled_core DIR      # compiles DIR/stream_ndcg in place (a worktree's own build)

The same modules (`core_build.BUILT_MODULES`), group and optimisation level as setup.py, and
its digests of the sources (`core_build.choose` runs a copy only if they match). It is built by
mypyc's own entry point and a bare setuptools `Distribution`, not setup.py: pyproject.toml's
metadata needs a newer setuptools than the venv may hold (`pip install` builds with its own, in
an isolated environment), and the copy is never installed. Its own process, in the copy's
directory: mypy reads pyproject.toml's settings there, and mypyc writes its C under `build/`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from stream_ndcg import core_build

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "stream_ndcg"


def build_in_place(root: Path) -> None:
    """Compile `root`/stream_ndcg's core beside its sources, with the digests of what it compiled."""
    from mypyc.build import mypycify
    from setuptools import Distribution, Extension  # type: ignore[import-untyped]  # (the venv has no stubs for it)

    os.chdir(root)
    extensions = mypycify([f"{PACKAGE}/{name}.py" for name in core_build.COMPILED_MODULES],
                          opt_level=core_build.OPT_LEVEL, group_name=core_build.GROUP_NAME)
    distribution = Distribution({"name": "stream-ndcg-compiled-copy",
                                 "ext_modules": [*extensions, *(Extension(**arguments)
                                                                for arguments in core_build.native_extensions())]})
    command = distribution.get_command_obj("build_ext")
    command.inplace = True
    distribution.run_command("build_ext")
    package_dir = root / PACKAGE
    (package_dir / core_build.DIGESTS_FILE).write_text(json.dumps(core_build.source_digests(package_dir),
                                                                  indent=1) + "\n")


def compiled_copy(root: Path, edit: Callable[[Path], None] | None = None) -> Path:
    """This tree's package copied into `root` (its sources alone), `edit`ed, and compiled there;
    the copy's package directory. The compiler's output goes to `root`/build.log."""
    package_dir = root / PACKAGE
    shutil.copytree(ROOT / PACKAGE, package_dir,
                    ignore=shutil.ignore_patterns("__pycache__", "*.so", core_build.DIGESTS_FILE))
    shutil.copy2(ROOT / "pyproject.toml", root / "pyproject.toml")
    if edit is not None:
        edit(package_dir)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop(core_build.PURE_VARIABLE, None)
    with open(root / "build.log", "w") as log:
        # -P: the bench's tree imports this module, the copy is only compiled.
        done = subprocess.run([sys.executable, "-P", "-m", "bench.harness.compiled_core", str(root)],
                              env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, check=False)
    built = core_build.choose(package_dir, {})
    if done.returncode or built.core != "compiled":
        raise SystemExit(f"the compiled copy in {root} did not build ({built.reason}): see {root / 'build.log'}")
    return package_dir


if __name__ == "__main__":
    build_in_place(Path(sys.argv[1]).resolve())
