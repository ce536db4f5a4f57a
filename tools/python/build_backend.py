"""The build backend of beamd-client: setuptools, run on a copy.

setuptools writes build/ and beamd_client.egg-info/ into the directory it
builds in, which for `pip install tools/python` is the source tree. Each
hook here copies the sources to a temporary directory and runs the
setuptools hook there, so an install leaves the tree as it was. Not part of
the installed packages (pyproject.toml lists them).
"""

import os
import shutil
import tempfile
from contextlib import contextmanager

from setuptools import build_meta as _st

_HERE = os.path.dirname(os.path.abspath(__file__))
_SKIP = shutil.ignore_patterns("build", "dist", "*.egg-info", "__pycache__", "*.pyc")


@contextmanager
def _in_copy():
    old = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="beamd-client-build-") as tmp:
        src = os.path.join(tmp, "src")
        shutil.copytree(_HERE, src, ignore=_SKIP)
        os.chdir(src)
        try:
            yield
        finally:
            os.chdir(old)


def _abs(d):
    return None if d is None else os.path.abspath(d)


def get_requires_for_build_wheel(config_settings=None):
    with _in_copy():
        return _st.get_requires_for_build_wheel(config_settings)


def get_requires_for_build_sdist(config_settings=None):
    with _in_copy():
        return _st.get_requires_for_build_sdist(config_settings)


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    d = _abs(metadata_directory)
    with _in_copy():
        return _st.prepare_metadata_for_build_wheel(d, config_settings)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    w, m = _abs(wheel_directory), _abs(metadata_directory)
    with _in_copy():
        return _st.build_wheel(w, config_settings, m)


def build_sdist(sdist_directory, config_settings=None):
    d = _abs(sdist_directory)
    with _in_copy():
        return _st.build_sdist(d, config_settings)
