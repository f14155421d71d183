"""pip install ./bindings/python  (offline: needs only setuptools and cffi,
e.g. Debian's python3-setuptools and python3-cffi, and a C compiler).

Finds libopeninfer through OPENINFER_INCLUDE_DIR / OPENINFER_LIB_DIR, else
pkg-config openinfer, else /usr/local (see openinfer/_build.py)."""
from setuptools import setup

setup(
    name="openinfer",
    version="0.1.0",
    description="Python binding of libopeninfer (host-memory tier for paged KV caches)",
    license="Apache-2.0",
    packages=["openinfer"],
    python_requires=">=3.9",
    install_requires=["cffi>=1.15"],
    cffi_modules=["openinfer/_build.py:ffibuilder"],
    zip_safe=False,
)
