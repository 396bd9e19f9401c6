"""Builds the optional C helpers: two plain shared objects, the C front of the eval callback
(harness/engine/cfilter.c, loaded with ctypes) and the mmap shim that lets a load skip MAP_POPULATE
(harness/engine/lazymap.c, preloaded by the `bmoe` command) and the read lanes (harness/engine/clanes.c, loaded
with ctypes), and one extension module, the cache policies' bookkeeping (harness/engine/policyc*.c). Everything else is in pyproject.toml. If the
compiler is missing, these optional parts are skipped: the engine then uses its pure-Python callback and
loads as llama.cpp does (and says which in its CSV), reads on the Python lanes (the same bytes), and the
policies score with numpy (the same decisions)."""

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

    def get_export_symbols(self, ext):  # the ctypes libraries have no PyInit_ symbol; _policyc is a module
        return super().get_export_symbols(ext) if ext.name.endswith("_policyc") else []


setup(
    ext_modules=[Extension("harness.engine._cfilter", ["harness/engine/cfilter.c"], extra_compile_args=["-O2"],
                           optional=True),
                 Extension("harness.engine._lazymap", ["harness/engine/lazymap.c"], extra_compile_args=["-O2"],
                           libraries=["dl"], optional=True),
                 Extension("harness.engine._clanes", ["harness/engine/clanes.c"], extra_compile_args=["-O2"],
                           libraries=["pthread"], optional=True),
                 Extension("harness.engine._policyc",
                           [f"harness/engine/{n}.c" for n in ("policyc", "policyc_markov", "policyc_heaps",
                                                              "policyc_core", "policyc_minheap", "policyc_lookup",
                                                              "policyc_duel")],
                           depends=["harness/engine/policyc.h"],
                           extra_compile_args=["-O2", "-ffp-contract=off", "-fvisibility=hidden"], optional=True)],
    cmdclass={"build_ext": OptionalBuildExt},
)
