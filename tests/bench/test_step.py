"""`bench step` pieces that need no engine: the timers and the section arithmetic."""

from __future__ import annotations

import time

import pytest

from vllm_edge.bench import step


class Thing:
    def work(self, dt: float) -> str:
        time.sleep(dt)
        return "done"


def test_timers_time_bound_methods_and_restore_them():
    obj = Thing()
    t = step.Timers()
    t.wrap(obj, "work", "forward")
    assert "work" in vars(obj)
    assert obj.work(0.01) == "done"
    obj.work(0.01)
    t.end_step(0.05)
    assert t.steps[0]["forward"] == pytest.approx(0.02, abs=0.015)
    assert t.steps[0]["step"] == 0.05 and t.current == {}
    t.close()
    assert "work" not in vars(obj)  # the class method shows through again
    obj.work(0)
    assert t.current == {}


def test_sections_add_up_to_the_step():
    row = {"step": 0.010, "schedule": 0.0002, "execute_model": 0.008, "forward": 0.006, "head": 0.001,
           "sample_tokens": 0.0008, "sampler": 0.0005, "update_from_output": 0.0001, "output": 0.0003}
    s = step.sections_of(row)
    assert s["prepare"] == pytest.approx(1.0)  # execute_model minus forward and head, in ms
    assert s["bookkeeping"] == pytest.approx(0.3)
    assert sum(s[k] for k in step.SECTIONS) == pytest.approx(10.0)
    assert s["outside_forward"] == pytest.approx(4.0)
    assert set(step.SECTION_HELP) == set(step.SECTIONS)


def test_metric_line_carries_medians_only():
    res = {"build": "b", "median_ms": {k: 1.0 for k in (*step.SECTIONS, "step", "outside_forward")},
           "tokens_per_s": 100.0, "op_counts": {"python_op_calls_per_step": 182},
           "voluntary_ctx_switches_per_step": 3.0}
    line = step.metric_line(res)
    assert line["step_ms"] == 1.0 and line["tg_tps"] == 100.0 and line["python_op_calls_per_step"] == 182
    assert "per_step_ms" not in line


def test_bad_arguments_are_refused_before_an_engine():
    with pytest.raises(step.speed.SpeedArgError, match="--steps"):
        step.validate(step.StepConfig(steps=2))
