"""Builds the optional C front of the eval callback (harness/engine/cfilter.c) as a plain shared object
loaded with ctypes. Everything else is in pyproject.toml. If the compiler is missing, the build of
this optional part is skipped and the engine uses its pure-Python callback (it says which in its CSV)."""

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class OptionalBuildExt(build_ext):
    def run(self) -> None:
        try:
            super().run()
        except Exception as e:  # noqa: BLE001
            print(f"bmoe: C callback filter not built ({e}); the pure-Python callback will be used")

    def build_extension(self, ext) -> None:
        try:
            super().build_extension(ext)
        except Exception as e:  # noqa: BLE001
            print(f"bmoe: C callback filter not built ({e}); the pure-Python callback will be used")

    def get_export_symbols(self, ext):  # a ctypes library, not a Python module: no PyInit_ symbol
        return []


setup(
    ext_modules=[Extension("harness.engine._cfilter", ["harness/engine/cfilter.c"], extra_compile_args=["-O2"],
                           optional=True)],
    cmdclass={"build_ext": OptionalBuildExt},
)
