"""pip install ./bindings/python  (offline: needs only setuptools and cffi,
e.g. Debian's python3-setuptools and python3-cffi, and a C compiler).

Finds libopeninfer through OPENINFER_INCLUDE_DIR / OPENINFER_LIB_DIR, else
pkg-config openinfer, else /usr/local, and records the library's directory
as the module's RUNPATH (see openinfer/_build.py).

pip builds in this directory (build/): the native module is always rebuilt,
so a build left there by an earlier install against another libopeninfer (other
environment variables, another prefix) is never reused."""
from setuptools import setup
from setuptools.command.build_ext import build_ext


class build_ext_always(build_ext):
    """Recompiles and relinks openinfer._native on every build: its inputs
    (where the headers and the library are, the RUNPATH) come from the
    environment, which the file timestamps build_ext compares know nothing of."""

    def finalize_options(self):
        super().finalize_options()
        self.force = True


setup(
    name="openinfer",
    version="0.1.0",
    description="Python binding of libopeninfer (host-memory tier for paged KV caches)",
    license="Apache-2.0",
    packages=["openinfer"],
    python_requires=">=3.9",
    install_requires=["cffi>=1.15"],
    cffi_modules=["openinfer/_build.py:ffibuilder"],
    cmdclass={"build_ext": build_ext_always},
    zip_safe=False,
)
