"""A pytest plugin for the pack's own test-suite (``addopts = "-p swa_backends.testing.pytest_checkout"``
in pyproject.toml): the repository root is the package itself, so it holds an ``__init__.py``,
and pytest collects the root as a ``Package`` whose set-up imports that ``__init__.py``. Under
the default import mode it is imported by the folder's name; a checkout folder whose name is
no Python identifier (``git clone ... swa-backends``) leaves it a plain module named
``__init__``, whose relative imports fail, and every test errors at set-up. The root holds no
tests and no module-level fixtures, so it is collected as a plain directory instead.
"""

from __future__ import annotations

import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_collect_directory(path, parent):
    if path == parent.config.rootpath and (path / "__init__.py").is_file():
        return pytest.Dir.from_parent(parent, path=path)
    return None
