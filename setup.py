"""Build the compiled core (batchsim/core/_core.c) with the package; metadata is in pyproject.toml.

The core is a plain C library with no Python headers, loaded with ctypes
(batchsim/core/__init__.py), so it is built as a setuptools extension whose
wheel tag says only the platform (``py3-none-<platform>``). Without a C
compiler (an sdist on a slim machine) the build goes on without it and
batchsim runs on its SimPy engine, saying so in every summary; set
``BATCHSIM_REQUIRE_CORE=1`` to make a missing core an error instead.
"""

import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "batchsim", "core"))
from build import compile_args, source_key  # noqa: E402  (batchsim/core/build.py: no imports of batchsim)

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools < 70
    from wheel.bdist_wheel import bdist_wheel

SOURCE = os.path.join("batchsim", "core", "_core.c")


class build_core(build_ext):
    """build_ext for a ctypes library: its compiler's flags, no PyInit symbol, optional."""

    def build_extension(self, ext):
        ext.extra_compile_args = compile_args(self.compiler.compiler_type)
        try:
            super().build_extension(ext)
        except Exception as exc:  # a missing or failing compiler: the SimPy engine runs instead
            if os.environ.get("BATCHSIM_REQUIRE_CORE"):
                raise
            self.warn(f"batchsim: the compiled core was not built ({exc}); runs use the SimPy engine")

    def get_export_symbols(self, ext):
        return []

    def get_ext_filename(self, ext_name):
        # not a Python extension module: no interpreter tag in its name (any Python 3 loads it)
        return os.path.join(*ext_name.split(".")) + (".dll" if sys.platform == "win32" else ".so")

    def copy_extensions_to_source(self):
        # (--inplace and editable installs: skip a core that could not be built)
        inplace, self.inplace = self.inplace, False
        self.extensions = [e for e in self.extensions if os.path.exists(self.get_ext_fullpath(e.name))]
        self.inplace = inplace
        super().copy_extensions_to_source()


class bdist_wheel_platform(bdist_wheel):
    """The core does not use Python's C API: the wheel fits any Python 3 on its platform."""

    def get_tag(self):
        _, _, plat = super().get_tag()
        return "py3", "none", plat


with open(SOURCE, "rb") as f:
    KEY = source_key(f.read())

setup(
    ext_modules=[Extension("batchsim.core._native", sources=[SOURCE],
                           define_macros=[("CORE_SOURCE_KEY", f'"{KEY}"')],
                           libraries=[] if sys.platform == "win32" else ["m"])],
    cmdclass={"build_ext": build_core, "bdist_wheel": bdist_wheel_platform},
)
