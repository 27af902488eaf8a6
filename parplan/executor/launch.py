"""Run a plan with torch.distributed and compare it with the cost model (docs/executor.md).

:func:`run_plan` spawns one process per device of the array (gloo on CPU), executes
``steps`` training steps of the plan on the partition its schedule gives, checks the loss and
every weight gradient against a single-process float64 reference, and compares the elements
each side of each split received, per node and phase, with the evaluator's figures at the
executed (integer) shares. A :class:`Cluster` keeps the processes for several runs (tests).

Example (needs torch):
    >>> from parplan.costmodel.hardware import parse_array
    >>> from parplan.costmodel.problem import Problem
    >>> from parplan.solvers.planners import make_plan
    >>> from parplan.models.zoo import get_model
    >>> p = Problem(get_model("lenet"), parse_array("cpu:2"), batch=4)
    >>> r = run_plan(p, make_plan(p, "accpar"))            # doctest: +SKIP
    >>> r.numerics_equal, r.bytes_equal                       # doctest: +SKIP
    (True, True)
"""

from __future__ import annotations

import math
import pickle
import queue
import socket
import traceback
from dataclasses import dataclass
from datetime import timedelta

import numpy as np
import pandas as pd

from parplan.costmodel.evaluate import evaluate
from parplan.costmodel.problem import Plan, Problem
from parplan.errors import ConfigError, ParplanError
from parplan.executor.schedule import Schedule, build_schedule, executed_plan, graph_frames

#: Relative tolerance of the numerics check (float64 sums in different orders).
RTOL = 1e-9
#: Largest number of processes ``run`` starts (one per device; CPUs run them in turn).
MAX_PROCESSES = 16
#: Seconds a collective may wait before the run is declared stuck.
TIMEOUT_S = 300
#: Largest memory a worker may need (bytes): every process keeps full-size float64 buffers.
MAX_PROCESS_BYTES = 4 * 2**30


def process_bytes(problem: Problem) -> float:
    """Rough memory of one worker: float64 weights (the weights, their gradient grid and a
    partial), and every tensor's values, gradient and partial buffers at the batch."""
    info = problem.graph.analyze()
    params = problem.graph.parameter_count()
    acts = problem.batch * sum(info.out_shape[n].elements for n in info.order)
    return 8.0 * (3 * params + 4 * acts)


class ExecutionError(ParplanError):
    """A worker process failed or the run timed out."""


def check_runnable(problem: Problem) -> None:
    """Raise :class:`ConfigError` if the run would start too many processes or need too much
    memory per process."""
    n = problem.array.count
    if n > MAX_PROCESSES:
        raise ConfigError(
            f"run: {n} devices; the executor starts one process per device, at most {MAX_PROCESSES}"
        )
    need = process_bytes(problem)
    if need > MAX_PROCESS_BYTES:
        raise ConfigError(
            f"run: each process would need about {need / 2**30:.1f} GiB (full-size float64 buffers "
            f"of every tensor; limit {MAX_PROCESS_BYTES / 2**30:.0f} GiB); use a smaller --batch or model"
        )


def free_port() -> int:
    """A free TCP port on this host (torch.distributed's rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Comm:
    """Blocking point-to-point transfers over the default process group."""

    def __init__(self, dist):
        self.dist = dist

    def send(self, tensor, dst: int) -> None:
        self.dist.send(tensor, dst)

    def recv(self, tensor, src: int) -> None:
        self.dist.recv(tensor, src)

    def isend(self, tensor, dst: int):
        """A send that does not wait (a pipeline's transfers across a cut); ``.wait()`` it."""
        return self.dist.isend(tensor, dst)


def _worker(rank: int, world: int, port: int, backend: str, jobs, results) -> None:
    import torch
    import torch.distributed as dist

    from parplan.executor.torchexec import run_device

    torch.set_num_threads(1)
    device = "cpu"
    if backend == "nccl":
        device = f"cuda:{rank % torch.cuda.device_count()}"
        torch.cuda.set_device(device)
    try:
        dist.init_process_group(
            backend,
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world,
            timeout=timedelta(seconds=TIMEOUT_S),
        )
    except Exception:  # noqa: BLE001 - reported to the parent, which raises
        results.put((rank, "error", traceback.format_exc()))
        return
    comm = _Comm(dist)
    while True:
        job = jobs.get()
        if job is None:
            break
        kind, payload = pickle.loads(job)
        try:
            if (
                kind == "dtensor"
            ):  # an exported plan through torch's own DTensor (executor/dtensor.py)
                from parplan.executor.dtensor import run_dtensor

                problem, export, seed, steps, lr = payload
                results.put(
                    (rank, "ok", run_dtensor(problem, export, rank, seed, steps, lr, device))
                )
            elif kind == "dtensor-pipeline":  # torch.distributed.pipelining (executor/dtensor.py)
                from parplan.executor.dtensor import run_pipeline_dtensor

                problem, plan, export, seed, steps, lr = payload
                results.put(
                    (
                        rank,
                        "ok",
                        run_pipeline_dtensor(problem, plan, export, rank, seed, steps, lr, device),
                    )
                )
            elif kind == "pipeline":  # a pipeline plan (executor/stages.py)
                from parplan.executor.torchexec import run_pipeline_device

                ps, seed, steps, lr = payload
                results.put(
                    (rank, "ok", run_pipeline_device(ps, rank, comm, seed, steps, lr, device))
                )
            else:
                schedule, seed, steps, lr = payload
                results.put((rank, "ok", run_device(schedule, rank, comm, seed, steps, lr, device)))
        except Exception:  # noqa: BLE001 - reported to the parent, which raises
            results.put((rank, "error", traceback.format_exc()))
    dist.destroy_process_group()


class Cluster:
    """``world`` worker processes joined in one process group, reused across runs.

    ``backend``: "gloo" (CPU tensors), "nccl" (one GPU per process, round robin over the GPUs
    present) or "auto" (nccl when there are GPUs, else gloo). Use as a context manager;
    :meth:`run` executes one schedule on all of them."""

    def __init__(self, world: int, backend: str = "auto"):
        import multiprocessing as mp

        _require_torch()
        backend = resolve_backend(backend)
        if not 1 <= world <= MAX_PROCESSES:
            raise ConfigError(
                f"run: {world} devices; the executor starts one process per device, at most "
                f"{MAX_PROCESSES}"
            )
        ctx = mp.get_context("spawn")
        port = free_port()
        self.world = world
        self.results = ctx.Queue()
        self.jobs = [ctx.Queue() for _ in range(world)]
        self.backend = backend
        self.procs = [
            ctx.Process(
                target=_worker,
                args=(r, world, port, backend, self.jobs[r], self.results),
                daemon=True,
            )
            for r in range(world)
        ]
        for p in self.procs:
            p.start()

    def run(
        self, schedule: Schedule, seed: int = 0, steps: int = 1, lr: float = 0.01
    ) -> list[dict]:
        if len(schedule.leaves) != self.world:
            raise ConfigError(
                f"run: the plan's array has {len(schedule.leaves)} devices but the cluster "
                f"{self.world}"
            )
        return self._run(("schedule", (schedule, seed, steps, lr)))

    def run_pipeline(self, ps, seed: int = 0, steps: int = 1, lr: float = 0.01) -> list[dict]:
        """A pipeline plan's schedule (:func:`parplan.executor.stages.build_pipeline_schedule`)."""
        if len(ps.leaves) != self.world:
            raise ConfigError(
                f"run: the plan's array has {len(ps.leaves)} devices but the cluster {self.world}"
            )
        return self._run(("pipeline", (ps, seed, steps, lr)))

    def run_torch(
        self,
        problem: Problem,
        export,
        seed: int = 0,
        steps: int = 1,
        lr: float = 0.01,
        pipeline=None,
    ) -> list[dict]:
        """An exported plan (:func:`parplan.executor.export.torch_export`) with torch's DTensor;
        a pipeline plan (``pipeline``, its :func:`~parplan.executor.export.pipeline_export`)
        with ``torch.distributed.pipelining`` and DTensor inside its stages."""
        if pipeline is not None:
            return self._run(("dtensor-pipeline", (problem, pipeline, export, seed, steps, lr)))
        if int(np.prod(export.mesh_shape)) != self.world:
            raise ConfigError(
                f"run: the export's mesh {export.mesh_shape} does not have the cluster's {self.world} "
                "devices"
            )
        return self._run(("dtensor", (problem, export, seed, steps, lr)))

    def _run(self, work: tuple) -> list[dict]:
        job = pickle.dumps(work)  # here, so that a failure is raised here
        for q in self.jobs:
            q.put(job)
        out: dict[int, dict] = {}
        errors = []
        waited = 0.0
        while len(out) + len(errors) < self.world:
            try:
                rank, status, payload = self.results.get(timeout=1.0)
            except queue.Empty:
                waited += 1.0
                dead = [r for r, p in enumerate(self.procs) if not p.is_alive() and r not in out]
                if dead:
                    codes = ", ".join(f"rank {r} exit code {self.procs[r].exitcode}" for r in dead)
                    raise ExecutionError(
                        f"run: worker process(es) ended without an answer ({codes}); when "
                        'running from Python, call run_plan under `if __name__ == "__main__":`'
                    ) from None
                if waited > TIMEOUT_S + 60:
                    raise ExecutionError(
                        f"run: no answer from {self.world - len(out)} worker(s) in "
                        f"{TIMEOUT_S + 60} s"
                    ) from None
                continue
            if status == "ok":
                out[rank] = payload
            else:
                errors.append(f"rank {rank}:\n{payload}")
        if errors:
            raise ExecutionError("run: a worker failed\n" + "\n".join(errors))
        return [out[r] for r in range(self.world)]

    def close(self) -> None:
        for q in self.jobs:
            q.put(None)
        for p in self.procs:
            p.join(timeout=5)
        for p in self.procs:
            if p.is_alive():
                p.terminate()

    def __enter__(self) -> "Cluster":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def resolve_backend(backend: str) -> str:
    """ "gloo" or "nccl" for ``backend`` ("auto": nccl when CUDA GPUs are present)."""
    _require_torch()
    import torch

    if backend not in ("auto", "gloo", "nccl"):
        raise ConfigError(f"run: backend must be auto, gloo or nccl (got {backend!r})")
    if backend == "auto":
        return "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl" and not torch.cuda.is_available():
        raise ConfigError(
            "run: backend nccl needs CUDA GPUs, and torch sees none; use --backend gloo"
        )
    return backend


def _require_torch() -> None:
    try:
        import torch  # noqa: F401
    except ImportError:
        raise ConfigError(
            "run: running a plan (the reference executor or torch's DTensor) needs torch; install it with "
            "pip install 'parplan[torch]' (CPU build: see README)"
        ) from None


@dataclass(frozen=True)
class ExecutionReport:
    """What a run measured next to what the model predicts.

    ``bytes`` has one row per (split, node, side, phase): the model's elements (evaluator at
    the executed shares), the elements received, their difference. ``timing`` has one row per
    node: the model's compute seconds on its slowest device and the slowest process's measured
    seconds (CPU time of the process in its own products and element-wise ops; the fastest
    step)."""

    losses: tuple[float, ...]
    reference_losses: tuple[float, ...]
    max_grad_rel_error: float
    bytes: pd.DataFrame
    timing: pd.DataFrame
    executed_shares: dict
    inexact_shares: tuple[str, ...]
    bytes_per_element: float

    @property
    def loss_rel_error(self) -> float:
        return max(
            abs(a - b) / max(abs(b), 1e-300) for a, b in zip(self.losses, self.reference_losses)
        )

    @property
    def diverged_at(self) -> int | None:
        """The first step (1-based) whose single-process loss is not finite: the training itself
        diverged (a learning rate too large), so the numerics cannot be compared; else None."""
        bad = [k for k, loss in enumerate(self.reference_losses) if not math.isfinite(loss)]
        return bad[0] + 1 if bad else None

    @property
    def numerics_equal(self) -> bool:
        return self.loss_rel_error <= RTOL and self.max_grad_rel_error <= RTOL

    @property
    def bytes_equal(self) -> bool:
        return bool(
            (self.bytes.difference.abs() <= 1e-6 * np.maximum(1.0, self.bytes.model_elements)).all()
        )

    def differences(self) -> pd.DataFrame:
        """Rows where the elements received differ from the model's."""
        b = self.bytes
        return b[b.difference.abs() > 1e-6 * np.maximum(1.0, b.model_elements)]


def compare_bytes(schedule: Schedule, received: dict, evaluation=None) -> pd.DataFrame:
    """Model vs measured elements per (split, node, side, phase); ``evaluation``: the
    evaluator's at the executed shares, if already computed."""
    ev = (
        evaluation
        if evaluation is not None
        else evaluate(schedule.problem, executed_plan(schedule))
    )
    rows = []
    for r in ev.breakdown.itertuples():
        for side in (1, 2):
            for phase, model in (
                ("intra", getattr(r, f"intra_elements_{side}")),
                ("transition", getattr(r, f"transition_elements_{side}")),
            ):
                got = received.get((r.level, r.node, side, phase), 0)
                rows.append(
                    (
                        r.level or "root",
                        r.node,
                        side,
                        phase,
                        float(model),
                        int(got),
                        got - float(model),
                    )
                )
    known = {(r.level, r.node) for r in ev.breakdown.itertuples()}
    for (split, node, side, phase), got in received.items():
        if (split, node) not in known:
            rows.append((split or "root", node, side, phase, 0.0, int(got), float(got)))
    order = {n.name: i for i, n in enumerate(schedule.problem.planning.nodes)}
    rows.sort(
        key=lambda r: (0 if r[0] == "root" else len(r[0]), r[0], order.get(r[1], -1), r[2], r[3])
    )
    return pd.DataFrame(
        rows,
        columns=[
            "split",
            "node",
            "side",
            "phase",
            "model_elements",
            "measured_elements",
            "difference",
        ],
    )


def _timing(schedule: Schedule, results: list[dict], evaluation) -> pd.DataFrame:
    """Per node: the model's compute time on its slowest device (the evaluator's) and the
    slowest process's measured time."""
    rows = []
    for v, node in enumerate(schedule.problem.planning.nodes):
        measured = max(min(s.get(node.name, 0.0) for s in res["seconds"]) for res in results)
        rows.append((node.name, evaluation.leaf_compute_s[v], float(measured)))
    return pd.DataFrame(rows, columns=["node", "model_s", "measured_s"])


def _check_run(problem: Problem, steps, lr) -> None:
    """Clear errors for a run's arguments, its layers and its size, before any process starts."""
    _require_torch()
    if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= 1000:
        raise ConfigError(f"run: steps must be an integer in [1, 1000] (got {steps!r})")
    if not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr >= 0):
        raise ConfigError(f"run: learning rate must be a finite number >= 0 (got {lr!r})")
    graph_frames(problem)  # unsupported layers first, then size
    check_runnable(problem)


def _outcome(problem: Problem, results: list[dict], seed: int, steps: int, lr: float):
    """(losses, one process's losses, largest gradient error, elements received in the first
    step per key) of the workers' ``results``."""
    from parplan.executor.torchexec import reference_run

    ref_losses, ref_grads = reference_run(problem, seed, steps, lr)
    losses = tuple(float(sum(r["losses"][k] for r in results)) for k in range(steps))
    received: dict = {}
    for r in results:
        for key, n in r["received"][0].items():
            received[key] = received.get(key, 0) + n
    return losses, tuple(ref_losses), _grad_error(results, ref_grads), received


def _as_planned(planned: dict, received: dict) -> None:
    if planned != received:
        raise ExecutionError(
            "run: the elements the workers received differ from the schedule's messages"
        )


def run_plan(
    problem: Problem,
    plan: Plan,
    steps: int = 1,
    seed: int = 0,
    lr: float = 0.01,
    cluster: Cluster | None = None,
    backend: str = "auto",
) -> ExecutionReport:
    """Execute ``steps`` training steps of ``plan`` with one process per device and compare.

    ``cluster``: worker processes to reuse (else started here with ``backend`` and stopped)."""
    _check_run(problem, steps, lr)
    schedule = build_schedule(problem, plan)
    if cluster is None:
        with Cluster(len(schedule.leaves), backend) as c:
            results = c.run(schedule, seed, steps, lr)
    else:
        results = cluster.run(schedule, seed, steps, lr)
    losses, ref_losses, err, received = _outcome(problem, results, seed, steps, lr)
    _as_planned(schedule.received(), received)
    ev = evaluate(problem, executed_plan(schedule))
    return ExecutionReport(
        losses,
        ref_losses,
        err,
        compare_bytes(schedule, received, ev),
        _timing(schedule, results, ev),
        schedule.executed_shares,
        schedule.inexact,
        problem.bytes_per_element,
    )


def _stage_bytes(ps, received: dict, evaluations: list) -> pd.DataFrame:
    """:func:`compare_bytes` of every stage (split paths made global: the stage's group before
    them), then per cut its moves (docs/costmodel.md section 11): the tensor across the cut and
    its gradient back (phase "forward" / "backward", split "cut c") and the moves inside the two
    groups (phase the move's kind, at its split and side), model against measured."""
    from parplan.costmodel.stages import boundary_moves, cut_elements

    problem, plan = ps.problem, ps.plan
    frames = []
    for s, (sched, ev) in enumerate(zip(ps.stages, evaluations)):
        group = plan.stages[s].group
        nodes = {n.name for n in sched.problem.planning.nodes}
        mine = {
            (key[0][len(group) :], *key[1:]): n
            for key, n in received.items()
            if key[0] != "cut" and key[1] in nodes
        }
        df = compare_bytes(sched, mine, ev)
        local = df.split.where(df.split != "root", "")
        df["split"] = [(group + x) or "root" for x in local]
        df.insert(0, "stage", s)
        frames.append(df)
    across = cut_elements(problem, plan)
    model: dict[tuple, float] = {}
    for c in range(len(ps.cuts)):
        model[("cut", c, "forward", "", 0)] = across[c] * problem.micro_batches
        model[("cut", c, "backward", "", 0)] = across[c] * problem.micro_batches
    p = len(ps.stages)
    for s, sched in enumerate(ps.stages):
        group = plan.stages[s].group
        for mv in boundary_moves(sched.problem, executed_plan(sched), s > 0, s < p - 1):
            c = s - 1 if mv.kind.startswith("input") else s
            key = ("cut", c, mv.kind, group + mv.split, mv.side)
            model[key] = model.get(key, 0.0) + mv.elements
    rows = []
    for key in sorted(set(model) | {k for k in received if k[0] == "cut"}, key=str):
        _, c, kind, split, side = key
        got = received.get(key, 0)
        want = model.get(key, 0.0)
        where = f"cut {c}" if kind in ("forward", "backward") else (split or "root")
        rows.append((c, where, ps.cuts[c].tensor, side, kind, want, int(got), got - want))
    cols = [
        "stage",
        "split",
        "node",
        "side",
        "phase",
        "model_elements",
        "measured_elements",
        "difference",
    ]
    frames.append(pd.DataFrame(rows, columns=cols))
    return pd.concat(frames, ignore_index=True)[cols]


def run_pipeline(
    problem: Problem,
    plan,
    steps: int = 1,
    seed: int = 0,
    lr: float = 0.01,
    cluster: Cluster | None = None,
    backend: str = "auto",
) -> ExecutionReport:
    """Execute ``steps`` training steps of a :class:`~parplan.costmodel.stages.PipelinePlan`
    (one process per device of the array; micro-batches in the plan's schedule) and compare
    with one process and with the model: each stage's bytes against the evaluator's price of
    its plan on its sub-problem, each cut's against section 11's transfers. The report's
    ``executed_shares`` are keyed "stage s/path"."""
    from parplan.executor.stages import build_pipeline_schedule

    _check_run(problem, steps, lr)
    ps = build_pipeline_schedule(problem, plan)
    if cluster is None:
        with Cluster(len(ps.leaves), backend) as c:
            results = c.run_pipeline(ps, seed, steps, lr)
    else:
        results = cluster.run_pipeline(ps, seed, steps, lr)
    losses, ref_losses, err, received = _outcome(problem, results, seed, steps, lr)
    _as_planned(ps.received(), received)
    evaluations = [evaluate(sched.problem, executed_plan(sched)) for sched in ps.stages]
    timing = pd.concat(
        [
            _timing(sched, [results[g] for g in ps.ranks[s]], ev)
            for s, (sched, ev) in enumerate(zip(ps.stages, evaluations))
        ],
        ignore_index=True,
    )
    shares = {
        f"stage {s}/{path}": v
        for s, sched in enumerate(ps.stages)
        for path, v in sched.executed_shares.items()
    }
    inexact = tuple(f"stage {s}/{x}" for s, sched in enumerate(ps.stages) for x in sched.inexact)
    return ExecutionReport(
        losses,
        ref_losses,
        err,
        _stage_bytes(ps, received, evaluations),
        timing,
        shares,
        inexact,
        problem.bytes_per_element,
    )


@dataclass(frozen=True)
class TorchRunReport:
    """A plan run through torch's DTensor (``run --runtime torch``): its losses and gradients
    next to one process's, and the collectives torch ran in the last step (``CommDebugMode``'s
    counts per collective, summed over the processes' views: every process counts the
    collectives it joins)."""

    losses: tuple[float, ...]
    reference_losses: tuple[float, ...]
    max_grad_rel_error: float
    collectives: dict
    export: object
    #: per collective, the elements of its inputs summed over the processes (the payload handed
    #: to torch; what the wire carries depends on torch's algorithm)
    payload_elements: dict = None
    #: the elements parplan's model has every side of every split receive for the same plan
    model_elements: float = 0.0

    @property
    def loss_rel_error(self) -> float:
        return max(
            abs(a - b) / max(abs(b), 1e-300) for a, b in zip(self.losses, self.reference_losses)
        )

    @property
    def numerics_equal(self) -> bool:
        return self.loss_rel_error <= RTOL and self.max_grad_rel_error <= RTOL


def run_torch(
    problem: Problem,
    plan: Plan,
    steps: int = 1,
    seed: int = 0,
    lr: float = 0.01,
    cluster: Cluster | None = None,
    backend: str = "auto",
) -> TorchRunReport:
    """Execute ``plan`` with torch's own DTensor (one process per device of the export's mesh)
    and compare its losses and gradients with one process's. Raises :class:`ConfigError`
    naming every part of the plan torch cannot express (:func:`~parplan.executor.export.nearest_plan`
    gives one it can)."""
    from parplan.executor.export import torch_export
    from parplan.executor.torchexec import reference_steps

    _require_torch()
    if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= 1000:
        raise ConfigError(f"run: steps must be an integer in [1, 1000] (got {steps!r})")
    pipeline = plan.__class__.__name__ == "PipelinePlan"
    export = _pipeline_export(problem, plan) if pipeline else torch_export(problem, plan)
    if not pipeline and not export.expressible:
        first = "; ".join(f"{a} at {b or 'root'}: {c}" for a, b, c in export.refusals[:3])
        raise ConfigError(
            f"run --runtime torch: torch cannot express {len(export.refusals)} part(s) of the plan "
            f"({first}); `parplan export --nearest` gives the closest plan it can run"
        )
    graph_frames(problem)
    check_runnable(problem)
    world = problem.array.count if pipeline else int(np.prod(export.mesh_shape))
    if cluster is None:
        with Cluster(world, backend) as c:
            results = c.run_torch(problem, export, seed, steps, lr, plan if pipeline else None)
    else:
        results = cluster.run_torch(problem, export, seed, steps, lr, plan if pipeline else None)
    ref_losses, grads = reference_steps(problem, seed, steps, lr)
    got = {name: g for r in results for name, g in r["grads"].items()}  # each stage's first
    worst = 0.0
    for name, want in grads.items():
        scale = max(float(want.abs().max()), 1e-300)
        worst = max(worst, float(np.abs(got[name] - want.numpy()).max()) / scale)
    payload: dict = {}
    for r in results:
        for name, b in r["payload_elements"].items():
            payload[name] = payload.get(name, 0) + b
    if pipeline:
        from parplan.costmodel.stages import evaluate_pipeline

        ev = evaluate_pipeline(problem, plan)
        model = sum(e.communication_elements for e in ev.stage_evaluations)
        losses = tuple(sum(r["losses"][k] for r in results) for k in range(steps))
    else:
        model = evaluate(problem, plan).communication_elements
        losses = tuple(results[0]["losses"])
    return TorchRunReport(
        losses, tuple(ref_losses), worst, results[0]["collectives"], export, payload, model
    )


def _pipeline_export(problem: Problem, plan):
    """The plan's :func:`~parplan.executor.export.pipeline_export`, or a :class:`ConfigError`
    naming what torch's pipelining with DTensor stages cannot run."""
    from parplan.executor.export import pipeline_export

    export = pipeline_export(problem, plan)
    why = [
        f"stage {s}: "
        + (
            st.refusal
            or "; ".join(f"{a} at {b or 'root'}: {c}" for a, b, c in st.export.refusals[:2])
        )
        for s, st in enumerate(export.stages)
        if st.export is None or not st.export.expressible
    ]
    if why:
        raise ConfigError(
            "run --runtime torch: torch cannot express the pipeline plan's " + "; ".join(why[:3])
        )
    shapes = {st.export.mesh_shape for st in export.stages}
    if len(shapes) != 1 or () in shapes:
        raise ConfigError(
            "run --runtime torch: torch.distributed.pipelining runs here stages on groups of "
            "equal size with at least 2 devices each (one mesh of 'pp' x the stages' mesh); "
            "use the reference executor (drop --runtime torch)"
        )
    if len({d for st in export.stages for d in st.export.mesh_dim_names}) != len(
        export.stages[0].export.mesh_dim_names
    ):
        raise ConfigError(
            "run --runtime torch: the stages' meshes name their dimensions differently"
        )
    return export


def _grad_error(results: list[dict], ref: dict) -> float:
    """Largest relative error of any weight gradient (every point of every weight must be held
    by some device; replicas must agree)."""
    worst = 0.0
    for name, want in ref.items():
        got = np.full(want.shape, np.nan)
        for r in results:
            if name not in r["grads"]:  # a pipeline stage without this layer
                continue
            dw, mask = r["grads"][name]
            m = np.broadcast_to(mask[..., None], dw.shape)
            clash = m & ~np.isnan(got) & ~np.isclose(got, dw, rtol=RTOL, atol=0)
            if clash.any():
                return math.inf
            got = np.where(m, dw, got)
        if np.isnan(got).any():
            return math.inf
        scale = max(float(np.abs(want).max()), 1e-300)
        worst = max(worst, float(np.abs(got - want).max()) / scale)
    return worst


__all__ = [
    "Cluster",
    "ExecutionError",
    "ExecutionReport",
    "TorchRunReport",
    "check_runnable",
    "compare_bytes",
    "process_bytes",
    "resolve_backend",
    "run_pipeline",
    "run_plan",
    "run_torch",
]
