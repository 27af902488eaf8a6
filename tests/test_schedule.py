"""The executor's schedule (numpy only, no processes) against the cost model on deeper and
uneven arrays: the elements its messages carry across each split, per node, side and phase,
equal the evaluator's (docs/costmodel.md section 3). tests/test_executor.py runs schedules
on real processes and checks that the workers receive exactly these messages."""

import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from parplan.costmodel.hardware import parse_array
from parplan.costmodel.problem import Problem
from parplan.executor.launch import compare_bytes
from parplan.executor.schedule import build_schedule
from test_executor_cases import BATCH, dags, plans


@pytest.mark.parametrize("array", ["cpu:3", "cpu:8", "cpu:2,h100:3"])
def test_schedule_bytes_equal_the_model(array):
    @seed(99)
    @settings(
        max_examples=25, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
    )
    @given(data=st.data())
    def prop(data):
        problem = Problem(data.draw(dags()), parse_array(array), batch=BATCH)
        schedule = build_schedule(problem, data.draw(plans(problem)))
        table = compare_bytes(schedule, schedule.received())
        bad = table[(table.difference.abs() > 1e-6 * table.model_elements.clip(lower=1.0))]
        assert bad.empty, bad.to_string()

    prop()
