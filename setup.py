"""Builds parplan's compiled pricing core (parplan/costmodel/_pricing.c; docs/architecture.md,
"The compiled core"). Everything else about the package is in pyproject.toml."""

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class BuildCore(build_ext):
    """build_ext that says what is missing when the C core cannot be built."""

    def run(self):
        try:
            super().run()
        except Exception as exc:  # a missing compiler or missing Python headers
            raise SystemExit(
                "parplan: could not build its compiled core (parplan/costmodel/_pricing.c): "
                f"{exc}\nparplan needs a C compiler (gcc or clang) and the Python development "
                "headers, e.g. `apt install gcc python3-dev` or `xcode-select --install`."
            ) from exc


setup(
    ext_modules=[
        Extension(
            "parplan.costmodel._pricing",
            ["parplan/costmodel/_pricing.c"],
            # one IEEE operation at a time, as the test oracle computes (no fused multiply-add,
            # no reassociation); -O3 vectorises loops over cells, never within one cell
            extra_compile_args=["-O3", "-ffp-contract=off", "-fno-fast-math"],
        )
    ],
    cmdclass={"build_ext": BuildCore},
)
