"""Every module's docstring examples run (they are the documentation)."""

import doctest
import importlib
import pkgutil

import pytest

import parplan

OPTIONAL = ("parplan.models.importers",)  # need torch / onnx; their own tests cover them
#: Modules that import torch when loaded: their doctests run where torch is installed (the
#: README's plain `.[dev]` environment has none).
NEEDS_TORCH = ("parplan.executor.torchexec", "parplan.executor.dtensor")


def modules():
    for info in pkgutil.walk_packages(parplan.__path__, "parplan."):
        if not info.name.startswith(OPTIONAL):
            yield info.name


@pytest.mark.parametrize("name", sorted(modules()))
def test_module_doctests(name):
    if name in NEEDS_TORCH:
        pytest.importorskip("torch")
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0, f"{result.failed} doctest failure(s) in {name}"
