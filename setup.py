"""The compiled core: mypyc compiles the pure core's typed modules where it can, pure Python otherwise.

Everything else about the package is in pyproject.toml. The modules compiled are
`stream_ndcg.core_build.COMPILED_MODULES` (by mypyc) and `NATIVE_MODULES` (from their C); beside
them the build writes a digest of each source it compiled, which an import compares before it
runs a compiled copy (core_build.choose).
The install never fails for want of the compiled core: without mypy, a C compiler, or with
STREAM_NDCG_PURE=1 at build time, it installs the Python sources alone and says why.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent


def _core_build() -> Any:
    """stream_ndcg/core_build.py by its path: importing the package here would select a build."""
    spec = importlib.util.spec_from_file_location("core_build", HERE / "stream_ndcg" / "core_build.py")
    if spec is None or spec.loader is None:
        raise RuntimeError("stream_ndcg/core_build.py not found beside setup.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


core_build = _core_build()


def _say(message: str) -> None:
    print(f"stream-ndcg: {message}", file=sys.stderr)


# The commands that build; the others (egg_info, dist_info: pip's metadata hooks) skip mypyc's work.
BUILDING = {"build", "build_ext", "bdist_wheel", "editable_wheel", "install", "develop"}


def _remove_compiled_copies() -> None:
    """An editable install that builds no compiled core leaves none of an earlier build beside the
    sources: its digests would still match, and the variable asked for pure."""
    package_dir = HERE / "stream_ndcg"
    for name in (*core_build.BUILT_MODULES, "core__mypyc"):
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            (package_dir / f"{name}{suffix}").unlink(missing_ok=True)
    (package_dir / core_build.DIGESTS_FILE).unlink(missing_ok=True)


def _extensions() -> list[Any]:
    if not BUILDING & set(sys.argv[1:]):
        return []
    extensions = _compiled_core()
    if not extensions and {"editable_wheel", "develop"} & set(sys.argv[1:]):
        _remove_compiled_copies()
    return extensions


def _compiled_core() -> list[Any]:
    if os.environ.get(core_build.PURE_VARIABLE, "") not in ("", "0"):
        _say(f"{core_build.PURE_VARIABLE} is set: the pure-Python core is installed alone")
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        _say("mypyc (mypy) is not installed: the pure-Python core is installed alone")
        return []
    sources = [f"stream_ndcg/{name}.py" for name in core_build.COMPILED_MODULES]
    try:
        extensions = mypycify(sources, opt_level=core_build.OPT_LEVEL, group_name=core_build.GROUP_NAME)
    except BaseException as error:  # mypyc exits (SystemExit) on a type error; the install must go on
        _say(f"mypyc failed ({error!r}): the pure-Python core is installed alone")
        return []
    extensions = [*extensions, *(Extension(**arguments) for arguments in core_build.native_extensions())]
    for extension in extensions:
        # A failed compile (no C compiler) skips the extension instead of failing the install.
        extension.optional = True
    return list(extensions)


class BuildCompiledCore(build_ext):
    """build_ext that records what it compiled, or removes a partial build."""

    def run(self) -> None:
        super().run()
        if not self.extensions:
            return
        outputs = [Path(self.get_ext_fullpath(extension.name)) for extension in self.extensions]
        package_dir = Path(self.get_ext_fullpath(f"stream_ndcg.{core_build.COMPILED_MODULES[0]}")).parent
        digests = package_dir / core_build.DIGESTS_FILE
        if all(output.exists() for output in outputs):
            digests.write_text(json.dumps(core_build.source_digests(HERE / "stream_ndcg"), indent=1) + "\n")
            _say(f"compiled core built ({len(outputs)} extensions)")
            return
        # Some extension failed: what did build would run beside sources of another build.
        for output in outputs:
            output.unlink(missing_ok=True)
        digests.unlink(missing_ok=True)
        _say("the compiled core did not build (see the compiler's errors above): the pure-Python core is installed")

    def get_outputs(self) -> list[str]:
        outputs: list[str] = super().get_outputs()
        if self.extensions:
            package_dir = Path(self.get_ext_fullpath(f"stream_ndcg.{core_build.COMPILED_MODULES[0]}")).parent
            if (package_dir / core_build.DIGESTS_FILE).exists():
                outputs.append(str(package_dir / core_build.DIGESTS_FILE))
        return outputs


setup(ext_modules=_extensions(), cmdclass={"build_ext": BuildCompiledCore})
