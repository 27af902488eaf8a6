"""``--cost-model pipedream-code`` against PipeDream's released optimizer.

parplan/data/pipedream/oracle.json holds what the optimizer (msr-fiddle/pipedream 7db6a1c,
optimizer_graph_hierarchical.py) printed on the five published profiles, 1 to 2 levels, 4 to
16 machines, with and without activation compression, under five Python hash seeds. Its
choice among tied plans depends on the seed (its predecessor sets iterate in hash order); its
time does not. So, on every recorded run (ResNet-50's, and the other branching models'
two-level runs, under ``pytest -m slow``):

- parplan's reproduction reaches the optimizer's time per minibatch and data-parallel
  baseline (to 1e-12);
- every plan the optimizer printed, priced by parplan's independent transcription of its
  formulas (:func:`code_price`), costs exactly the time it reported;
- where the optimizer's plan did not depend on the seed, parplan's plan is that plan.
"""

import json
import math

import pytest

from parplan.errors import ConfigError
from parplan.pipeline.evaluate import evaluate_plan
from parplan.pipeline.machine import flat_machine, hierarchical_machine
from parplan.pipeline.pipedream_code import (
    PROFILES,
    CodeStage,
    code_plan,
    code_price,
    code_price_sets,
    code_states,
    side_by_side,
    to_level_plan,
)
from parplan.pipeline.plans import LevelPlan, Stage
from parplan.pipeline.profile import ProfiledLayer, PipelineProfile, read_profile

ORACLE = json.loads((PROFILES / "oracle.json").read_text())["runs"]
#: Runs behind the slow marker: ResNet-50 (240 antichain states; its two-level tables take
#: 10-15 s) and the other branching models' two-level runs. The default run keeps every chain
#: run and every branching model's one-level runs.
SLOW_MODELS = {"resnet50"}
SLOW_TWO_LEVEL = {"resnet18", "gnmt"}


def _slow(run) -> bool:
    return run["model"] in SLOW_MODELS or (
        run["model"] in SLOW_TWO_LEVEL and len(run["machines"]) > 1
    )


def _id(run):
    machines = "x".join(map(str, run["machines"]))
    return f"{run['model']}-{machines}-{run['bandwidths'][0] / 1e9:g}GBps-c{run['compression']}"


_STATES = {}


def _states(model):
    if model not in _STATES:
        _STATES[model] = code_states(read_profile(PROFILES / f"{model}.graph.txt"))
    return _STATES[model]


def _as_stages(states, levels):
    index = {a: i for i, a in enumerate(states.antichains)}
    return [
        [
            CodeStage(index[frozenset(a)] + 1 if a else 0, index[frozenset(b)] + 1, r)
            for a, b, r in level
        ]
        for level in levels
    ]


def _keyed(states, plan):
    return [
        [
            [
                sorted(states.antichains[s.start - 1]) if s.start else None,
                sorted(states.antichains[s.end - 1]),
                s.replicas,
            ]
            for s in level
        ]
        for level in plan.levels
    ]


RUNS = [pytest.param(r, id=_id(r), marks=[pytest.mark.slow] if _slow(r) else []) for r in ORACLE]


@pytest.mark.parametrize("run", RUNS)
def test_the_released_optimizer_is_reproduced(run):
    st = _states(run["model"])
    plan = code_plan(None, run["machines"], run["bandwidths"], run["compression"], states=st)
    assert plan.seconds == pytest.approx(run["pipeline_s"], rel=1e-12)
    assert plan.data_parallel_seconds == pytest.approx(run["data_parallel_s"], rel=1e-12)
    # every machine is used at every level, as the optimizer's defaults do
    for level, machines in zip(plan.levels, reversed(plan.machines)):
        per_range = {}
        for s in level:
            per_range.setdefault(_outer(plan, level, s), 0)
            per_range[_outer(plan, level, s)] += s.replicas
        assert set(per_range.values()) == {machines}
    # its plans and ours, priced by the independent transcription, cost what it reported
    for levels in run["plans"]:
        price = code_price(
            st, run["machines"], run["bandwidths"], _as_stages(st, levels), run["compression"]
        )
        assert price == pytest.approx(run["pipeline_s"], rel=1e-12)
    assert code_price(
        st, run["machines"], run["bandwidths"], plan.levels, run["compression"]
    ) == pytest.approx(plan.seconds, rel=1e-12)
    if (
        len(run["plans"]) == 1
    ):  # the optimizer's choice did not depend on the hash seed: the same plan
        assert _keyed(st, plan) == run["plans"][0]


def _outer(plan, level, stage):
    """The range of the level above that holds ``stage`` (the whole model at the top)."""
    depth = plan.levels.index(level)
    if depth == 0:
        return (0, plan.states.n)
    return next(
        (s.start, s.end)
        for s in plan.levels[depth - 1]
        if s.start <= stage.start and stage.end <= s.end
    )


def test_some_recorded_choices_depend_on_the_hash_seed_and_some_do_not():
    # the reason the test above compares plans only where the optimizer's choice was stable
    stable = [r for r in ORACLE if len(r["plans"]) == 1]
    assert 0 < len(stable) < len(ORACLE)


def _toy(edges=None, compute=(1.0, 2.0, 3.0), params=(4e9, 0.0, 2e9)):
    layers = [ProfiledLayer("in", "Input", 5.0, 0.0, 1e9, 0.0)]
    layers += [
        ProfiledLayer(f"l{i}", "Linear", c / 2, c / 2, 1e9 * (i + 1), w)
        for i, (c, w) in enumerate(zip(compute, params))
    ]
    names = [x.name for x in layers]
    edges = edges or tuple(zip(names[:-1], names[1:]))
    return PipelineProfile("toy", tuple(layers), tuple(edges), declared=tuple(names))


def test_code_formulas_on_a_hand_example():
    """Three layers (compute 1, 2, 3 s; weights 4, 0, 2 GB) after an Input whose 5 s of loading
    the optimizer zeroes. On 2 machines at 1 GB/s:

    - one stage on 2 replicas: (6 + 4 x 1/2 x 6 GB / 1 GB/s) / 2 = (6 + 12) / 2 = 9 s;
    - split after l0: max(l0 on 1 = 1, (5 + 4 x 0 x 2) / 1 = 5) = 5 s;
    - split after l1: max(l0..l1 on 1 = 3, l2 on 1 = 3) = 3 s, the optimum.
    Data parallelism: (6 + 4 x 1/2 x 6) / 2 = 9 s. With compression 2, a non-first stage also
    waits for 2 x activation / (B x m') / 2: the cut after l1 carries 2 GB -> 2 s (still 3 s).
    """
    prof = _toy()
    plan = code_plan(prof, [2], [1e9])
    assert [(s.start, s.end, s.replicas) for s in plan.levels[0]] == [(0, 2, 1), (2, 3, 1)]
    assert plan.seconds == pytest.approx(3.0) and plan.data_parallel_seconds == pytest.approx(9.0)
    assert plan.single_seconds == pytest.approx(6.0)  # the input's loading time is not counted
    st = plan.states
    assert code_price(st, [2], [1e9], [[CodeStage(0, 3, 2)]]) == pytest.approx(9.0)
    assert code_price(st, [2], [1e9], [[CodeStage(0, 1, 1), CodeStage(1, 3, 1)]]) == pytest.approx(
        5.0
    )
    # compression 0.5 doubles the transfers: the cut after l1 (2 GB) takes 2 x 2 / 1 / 0.5 = 8 s
    assert code_price(
        st, [2], [1e9], [[CodeStage(0, 2, 1), CodeStage(2, 3, 1)]], 0.5
    ) == pytest.approx(8.0)
    assert code_plan(prof, [2], [1e9], 0.5).seconds == pytest.approx(
        min(9.0, 8.0, max(1.0, 5.0, 2 * 1 / 0.5))
    )


def test_the_first_stage_of_a_level_divides_its_sync_by_the_machines_below():
    """Two levels (2 machines of 2 devices): the top level's first stage pays its sync divided
    by the 2 devices of a machine (the optimizer's initial term; its later stages do not)."""
    st = code_plan(_toy(), [2, 2], [1e9, 1e9]).states
    inner = [CodeStage(0, 3, 2)]  # every top stage's inner plan: one stage on both devices
    # top: one stage on 2 machines of the whole model: inner time 9 s (as above)
    whole = code_price(st, [2, 2], [1e9, 1e9], [[CodeStage(0, 3, 2)], inner])
    assert whole == pytest.approx((9.0 + 4 * 1 * 6 / 2 / 2) / 2)


def test_branching_profiles_are_planned_over_antichains():
    prof = _toy(edges=(("in", "l0"), ("l0", "l1"), ("l0", "l2"), ("l1", "l2")))
    st = code_states(prof)
    # antichains: {l0}, {l1} augmented with l0 (it also feeds l2), {l2}
    assert [sorted(a) for a in st.antichains] == [["l0"], ["l0", "l1"], ["l2"]]
    assert st.output_bytes == (1e9, 3e9, 3e9) and st.preds == ((), (0,), (0, 1))
    assert st.removed == ("in",)


def test_parplan_plans_priced_by_the_code_model():
    prof = read_profile(PROFILES / "vgg16.graph.txt")
    machine = flat_machine(4, 1e9)
    sbs = side_by_side(prof, machine)
    names = tuple(x.name for x in prof.layers)
    # the optimizer's stages are contiguous in parplan's order on a chain, and parplan prices them
    lp = to_level_plan(sbs.code, names)
    assert lp is not None and lp.stages[0].first == 0 and lp.stages[-1].last == len(names) - 1
    assert sbs.code_by_parplan == pytest.approx(
        evaluate_plan(prof, machine, lp).seconds_per_minibatch
    )
    # parplan's data-parallel plan under the code's formulas is the code's own baseline
    dp = LevelPlan(1, (Stage(0, len(names) - 1, 4),))
    assert code_price_sets(sbs.code.states, [4], [1e9], dp, names) == pytest.approx(
        sbs.code.data_parallel_seconds
    )
    # each model prefers its own plan
    assert sbs.code.seconds <= sbs.native_by_code * (1 + 1e-12)
    assert sbs.native.seconds_per_minibatch <= sbs.code_by_parplan * (1 + 1e-12)
    rows = {r["plan"]: r for r in sbs.rows()}
    assert rows["pipedream-code"]["code_speedup_vs_dp"] == pytest.approx(
        3.3187143555086274, rel=1e-12
    )


def test_two_level_plans_map_to_parplan_plans():
    prof = read_profile(PROFILES / "alexnet.graph.txt")
    machine = hierarchical_machine([(4, 1e10, 0.0), (4, 1e9, 0.0)])
    sbs = side_by_side(prof, machine)
    lp = to_level_plan(sbs.code, tuple(x.name for x in prof.layers))
    assert lp.level == 2 and all(s.inner is not None and s.inner.level == 1 for s in lp.stages)
    assert sum(s.replicas for s in lp.stages) == 4
    assert math.isfinite(sbs.code_by_parplan)


@pytest.mark.parametrize(
    "machines, bandwidths, compression, message",
    [
        ([4], [1e9, 1e9], None, "one bandwidth per level"),
        ([0], [1e9], None, "integers >= 1"),
        ([4], [0.0], None, "bandwidths must be > 0"),
        ([4], [1e9], 0.0, "compression ratio must be > 0"),
    ],
)
def test_bad_machines_are_refused(machines, bandwidths, compression, message):
    with pytest.raises(ConfigError, match=message):
        code_plan(_toy(), machines, bandwidths, compression)
