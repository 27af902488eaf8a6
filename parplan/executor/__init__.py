"""The reference executor: runs a plan with torch.distributed, checks its numerics against one
process and counts every element it moves against the cost model (docs/executor.md).

:mod:`.schedule` (numpy only) derives what each device computes, holds and receives;
:mod:`.torchexec` runs one device's part with torch; :mod:`.launch` starts the processes and
compares.
"""

from parplan.executor.schedule import Schedule, build_schedule, executed_plan

__all__ = ["Schedule", "build_schedule", "executed_plan"]
