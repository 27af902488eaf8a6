"""parplan's error hierarchy.

Every error a user can cause is a :class:`ParplanError`; its message names the input, the rule
and, where there is one, the fix (e.g. ``"layer 'fc6': out_features must be > 0 (got 0)"``).
The CLI prints these messages without a traceback.
"""


class ParplanError(Exception):
    """Base class of every user-facing parplan error."""


class GraphError(ParplanError):
    """A layer graph is malformed: cycles, unknown inputs, shape mismatches, bad sizes."""


class HardwareError(ParplanError):
    """An unknown device, a malformed array description or a bad hardware figure."""


class ConfigError(ParplanError):
    """An invalid option combination or value (objective, shares, planner, backend ...)."""


class SolverError(ParplanError):
    """A solver backend is unavailable or failed in a way that is not the user's input."""


class TableTooLarge(SolverError):
    """The exact DP would need a table larger than its limit (a node with many consumers)."""


class InfeasibleError(ParplanError):
    """The planning problem has no feasible plan (e.g. memory too small)."""
