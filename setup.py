"""Builds the optional C helpers as plain shared objects: the C front of the eval callback
(harness/engine/cfilter.c, loaded with ctypes) and the mmap shim that lets a load skip MAP_POPULATE
(harness/engine/lazymap.c, preloaded by the `bmoe` command). Everything else is in pyproject.toml. If the
compiler is missing, these optional parts are skipped: the engine then uses its pure-Python callback and
loads as llama.cpp does, and says which in its CSV. The third, the compiled read lanes
(harness/engine/clanes.c), falls back to the Python lanes."""

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class OptionalBuildExt(build_ext):
    def run(self) -> None:
        try:
            super().run()
        except Exception as e:  # noqa: BLE001
            print(f"bmoe: optional C helper not built ({e}); the engine falls back (pure-Python callback, or a populating load)")

    def build_extension(self, ext) -> None:
        try:
            super().build_extension(ext)
        except Exception as e:  # noqa: BLE001
            print(f"bmoe: optional C helper not built ({e}); the engine falls back (pure-Python callback, or a populating load)")

    def get_export_symbols(self, ext):  # a ctypes library, not a Python module: no PyInit_ symbol
        return []


setup(
    ext_modules=[Extension("harness.engine._cfilter", ["harness/engine/cfilter.c"], extra_compile_args=["-O2"],
                           optional=True),
                 Extension("harness.engine._lazymap", ["harness/engine/lazymap.c"], extra_compile_args=["-O2"],
                           libraries=["dl"], optional=True),
                 Extension("harness.engine._clanes", ["harness/engine/clanes.c"], extra_compile_args=["-O2"],
                           libraries=["pthread"], optional=True)],
    cmdclass={"build_ext": OptionalBuildExt},
)
