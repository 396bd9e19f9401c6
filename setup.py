"""Builds the optional C helpers of harness/engine/native/ with one compiler profile: three plain shared objects,
the C front of the eval callback (cfilter.c, loaded with ctypes), the mmap shim that lets a load skip MAP_POPULATE
(lazymap.c, preloaded by the `bmoe` command) and the read lanes (clanes.c, loaded with ctypes), and one extension
module, the cache policies' bookkeeping (policyc*.c). Everything else is in pyproject.toml. If the
compiler is missing, these optional parts are skipped: the engine then uses its pure-Python callback and
loads as llama.cpp does (and says which in its CSV), reads on the Python lanes (the same bytes), and the
policies score with numpy (the same decisions)."""

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

FALLBACK = "the engine falls back (pure-Python callback, populating load, Python lanes or numpy policies)"


class OptionalBuildExt(build_ext):
    def run(self) -> None:
        try:
            super().run()
        except Exception as e:  # noqa: BLE001
            print(f"bmoe: optional C helper not built ({e}); {FALLBACK}")

    def build_extension(self, ext) -> None:
        try:
            super().build_extension(ext)
        except Exception as e:  # noqa: BLE001
            print(f"bmoe: optional C helper not built ({e}); {FALLBACK}")

    def get_export_symbols(self, ext):  # the ctypes libraries have no PyInit_ symbol; _policyc is a module
        return super().get_export_symbols(ext) if ext.name.endswith("_policyc") else []


# every C twin is built alike: -ffp-contract=off keeps the policies' float arithmetic numpy's, bit for bit
# (tests/engine/test_policy_bits.py); -fno-semantic-interposition lets calls inside a library be inlined, as
# -fvisibility=hidden did for _policyc alone, while the ctypes libraries keep their symbols visible
COMPILE_ARGS = ["-O2", "-ffp-contract=off", "-fno-semantic-interposition"]
NATIVE = "harness/engine/native"

setup(
    ext_modules=[Extension("harness.engine.native._cfilter", [f"{NATIVE}/cfilter.c"], extra_compile_args=COMPILE_ARGS,
                           optional=True),
                 Extension("harness.engine.native._lazymap", [f"{NATIVE}/lazymap.c"], extra_compile_args=COMPILE_ARGS,
                           libraries=["dl"], optional=True),
                 Extension("harness.engine.native._clanes", [f"{NATIVE}/clanes.c", f"{NATIVE}/clanes_groups.c",
                                                              f"{NATIVE}/clanes_pool.c", f"{NATIVE}/clanes_move.c"],
                           depends=[f"{NATIVE}/clanes_common.h", f"{NATIVE}/clanes_pool_common.h"],
                           extra_compile_args=COMPILE_ARGS, libraries=["pthread"], optional=True),
                 Extension("harness.engine.native._policyc",
                           [f"{NATIVE}/{n}.c" for n in ("policyc", "policyc_markov", "policyc_heaps", "policyc_core",
                                                     "policyc_aged_batch", "policyc_minheap", "policyc_lookup",
                                                     "policyc_duel")],
                           depends=[f"{NATIVE}/policyc.h", f"{NATIVE}/policyc_aged.h"],
                           extra_compile_args=COMPILE_ARGS, optional=True)],
    cmdclass={"build_ext": OptionalBuildExt},
)
