"""The compiled pricing core (``_pricing.c``; docs/architecture.md, "The compiled core"),
loaded once, with a message that says what to do when it was not built."""

try:
    from parplan.costmodel import _pricing as core
except ImportError as exc:  # a source tree used without `pip install`
    raise ImportError(
        "parplan's compiled core (parplan/costmodel/_pricing.c) is not built: install parplan with "
        "`pip install -e .` (or `pip install .`) in the repository; it needs a C compiler and the "
        "Python development headers"
    ) from exc

__all__ = ["core"]
