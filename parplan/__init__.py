"""parplan: plan, price and certify tensor partitioning of DNN training on accelerator arrays.

The public API (docs/architecture.md lists the layers behind it):

- :class:`Problem` (a model on an array at a batch size), :func:`load_model` (zoo name, model
  file, layer table, ONNX or ``file.py:factory``), :func:`parse_array` (``"h100:8"``,
  ``"tpu-v2:64,tpu-v3:64"``, a tree file);
- :func:`plan` (a named planner: the fast DP path), :func:`solve` (exact MIP, level by level,
  with a certificate), :func:`certify` (DP vs exact on one problem), :func:`global_bound` (a
  lower bound on the step time of every plan of the whole array), :func:`continuous_split` /
  :func:`continuous_plan` (shares anywhere in [0, 1], proven optimal per split);
- :func:`evaluate` (the one evaluator: prices any plan on any problem);
- :class:`Plan`; :func:`save_plan` / :func:`load_plan` / :func:`read_plan_file`: plan files
  (docs/planfile.md).

Names are imported on first use, so ``import parplan`` (and the ``parplan`` command) stay fast.

Example:
    >>> import parplan
    >>> p = parplan.Problem(parplan.load_model("alexnet"), parplan.parse_array("tpu-v2:2,tpu-v3:2"), batch=128)
    >>> acc, data = parplan.plan(p, "accpar"), parplan.plan(p, "data")
    >>> parplan.evaluate(p, acc).step_time_s <= parplan.evaluate(p, data).step_time_s
    True
    >>> sorted(acc.splits)
    ['', 'L', 'R']
"""

from __future__ import annotations

from importlib import import_module

#: Public name -> (module, attribute).
_EXPORTS = {
    "Problem": ("parplan.costmodel.problem", "Problem"),
    "Plan": ("parplan.costmodel.problem", "Plan"),
    "Split": ("parplan.costmodel.problem", "Split"),
    "PartitionType": ("parplan.costmodel.layout", "PartitionType"),
    "Layout": ("parplan.costmodel.layout", "Layout"),
    "parse_array": ("parplan.costmodel.hardware", "parse_array"),
    "load_devices": ("parplan.costmodel.hardware", "load_devices"),
    "load_model": ("parplan.models.modelfile", "load_model"),
    "evaluate": ("parplan.costmodel.evaluate", "evaluate"),
    "plan": ("parplan.solvers.planners", "make_plan"),
    "fit_plan": ("parplan.solvers.fit", "fit_plan"),
    "megatron_plan": ("parplan.solvers.megatron", "megatron_plan"),
    "InfeasibleError": ("parplan.errors", "InfeasibleError"),
    "solve": ("parplan.solvers.exact", "solve_exact"),
    "certify": ("parplan.solvers.exact", "certify"),
    "continuous_split": ("parplan.solvers.continuous", "continuous_split"),
    "continuous_plan": ("parplan.solvers.continuous", "continuous_plan"),
    "global_bound": ("parplan.solvers.bound", "global_bound"),
    "sweep": ("parplan.bench.sweep", "sweep"),
    "read_plan_file": ("parplan.costmodel.planio", "read_plan_file"),
    "save_plan": ("parplan.costmodel.planio", "save_plan"),
    "load_plan": ("parplan.costmodel.planio", "load_plan"),
    "ParplanError": ("parplan.errors", "ParplanError"),
    "ConfigError": ("parplan.errors", "ConfigError"),
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str):
    if name == "__version__":  # read on use: importlib.metadata costs ~20 ms at every start
        from importlib.metadata import PackageNotFoundError, version

        try:
            value = version("parplan")
        except PackageNotFoundError:  # a source tree that was never installed
            value = "unknown"
        globals()[name] = value
        return value
    if name in _EXPORTS:
        module, attr = _EXPORTS[name]
        value = getattr(import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'parplan' has no attribute '{name}'")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
