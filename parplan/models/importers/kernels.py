"""Kernels a library writes as a Python loop, traced as one operator (docs/importers.md).

Mamba's selective scan runs, without its CUDA kernel, as one Python step per position: traced
at 2,048 positions that is 2,048 steps per layer (minutes of tracing), and the importer would
see a loop, not the scan. While a model is captured, :func:`as_operators` replaces such a
function in the library's module with a call to a ``parplan::`` custom operator of the same
inputs: torch.export records one node, which the torch frontend maps to one layer
(:class:`parplan.costmodel.graph.Scan`). The operator's own implementation calls the library's
function, so a model run while it is patched computes what it computed before.

Replaced (where the module is imported):

- ``mamba_selective_scan`` of ``transformers.models.mamba.modeling_mamba`` (Mamba), and its
  copies in FalconMamba's and Jamba's modules; its ``D``, gate ``z``, time step bias and
  softplus are the operator's inputs too. The operator's implementation calls the first
  library function it replaced (the copies compute the same).
"""

from __future__ import annotations

import contextlib
import sys

#: (module, function) replaced while a model is captured.
SCANS = tuple(
    (f"transformers.models.{name}.modeling_{name}", "mamba_selective_scan")
    for name in ("mamba", "falcon_mamba", "jamba")
)

#: The operator the torch frontend maps to a :class:`~parplan.costmodel.graph.Scan`.
SCAN_OP = "parplan.selective_scan"

_ops: dict = {}


def _scan_op():
    """The ``parplan::selective_scan`` custom operator (defined once per process)."""
    if "scan" in _ops:
        return _ops["scan"]
    import torch

    @torch.library.custom_op(
        "parplan::selective_scan",
        mutates_args=(),
        schema="(Tensor x, Tensor dt, Tensor A, Tensor B, Tensor C, Tensor? D, Tensor? z, "
        "Tensor? delta_bias, bool delta_softplus) -> Tensor",
    )
    def selective_scan(x, dt, A, B, C, D, z, delta_bias, delta_softplus):
        original = _ops["original"]
        return original(
            x, dt, A, B, C, D=D, z=z, delta_bias=delta_bias, delta_softplus=delta_softplus
        ).clone()

    @selective_scan.register_fake
    def _(x, dt, A, B, C, D, z, delta_bias, delta_softplus):
        return torch.empty_like(x)

    _ops["scan"] = selective_scan
    return selective_scan


@contextlib.contextmanager
def as_operators():
    """While inside, the functions of :data:`SCANS` whose modules are imported call the
    ``parplan::`` operators (a call the operator cannot take, such as one that asks for the
    last state, goes to the library's function as before)."""
    patched = []
    try:
        for module_name, attr in SCANS:
            module = sys.modules.get(module_name)
            original = getattr(module, attr, None)
            if original is None:
                continue
            op = _scan_op()
            _ops.setdefault("original", original)

            def scan(
                hidden_states,
                dt,
                A,
                B,
                C,
                D=None,
                z=None,
                delta_bias=None,
                delta_softplus=False,
                return_last_state=False,
                _original=original,
                **kwargs,
            ):
                if return_last_state:  # the state for a cache: not a training step
                    return _original(
                        hidden_states,
                        dt,
                        A,
                        B,
                        C,
                        D=D,
                        z=z,
                        delta_bias=delta_bias,
                        delta_softplus=delta_softplus,
                        return_last_state=return_last_state,
                        **kwargs,
                    )
                return op(hidden_states, dt, A, B, C, D, z, delta_bias, bool(delta_softplus))

            setattr(module, attr, scan)
            patched.append((module, attr, original))
        yield
    finally:
        for module, attr, original in reversed(patched):
            setattr(module, attr, original)


__all__ = ["SCANS", "SCAN_OP", "as_operators"]
