"""Task oracles: a perfect scripted agent passes everything; wrong agents fail for the right reason."""

from __future__ import annotations

import pytest

from vllm_edge.agent import android
from vllm_edge.agent.device import VARIANTS, Alarm
from vllm_edge.agent.loop import Trace
from vllm_edge.agent.suite import run_one
from vllm_edge.agent.tasks import TASKS, select_tasks, select_variants

ALL_VARIANTS = list(VARIANTS) + ["renamed+reordered+decoy+deeper"]


@pytest.mark.parametrize("variant", ALL_VARIANTS)
@pytest.mark.parametrize("task", list(TASKS))
def test_perfect_agent_passes(task, variant, scripted):
    o = run_one(TASKS[task], variant, scripted(task), max_steps=20)
    assert o.success, o.failure_reason
    assert o.goal_reached and o.declared_done and o.collateral == []
    assert not o.falsely_claimed_done and o.failure_reason is None
    assert o.noop_actions == 0 and o.self_undos == 0 and o.recoveries == 0


@pytest.mark.parametrize("task", ["wifi_on", "airplane_on", "add_alarm_730am"])
def test_perfect_agent_with_open_app(task, scripted):
    o = run_one(TASKS[task], "deeper", scripted(task, use_open_app=True))
    assert o.success, o.failure_reason


def test_wifi_already_on_any_toggle_is_collateral(scripted):
    o = run_one(TASKS["wifi_already_on"], "base", scripted("wifi_already_on", {"toggle_anyway"}))
    assert o.final_state["settings"]["wifi"] is True  # it ended on, as asked...
    assert o.goal_reached and o.declared_done
    assert not o.success  # ...but it was switched off and on again
    assert o.collateral == ["Wi-Fi was toggled 2 time(s) although it was already on"]
    assert o.falsely_claimed_done


def test_toggling_wifi_twice_is_fine_when_it_was_off(scripted):
    o = run_one(TASKS["wifi_on"], "base", scripted("wifi_on", {"undo"}))
    assert o.success, o.failure_reason
    assert o.self_undos == 2  # on -> off (undoes the first tap), off -> on (undoes the second)


def test_pm_alarm_does_not_reach_the_goal(scripted):
    o = run_one(TASKS["add_alarm_730am"], "base", scripted("add_alarm_730am", {"pm"}))
    assert "19:30" in o.final_state["alarms"]
    assert not o.goal_reached and not o.success
    assert "goal not reached: alarm saved at 7:30 PM, not 7:30 AM" in o.failure_reason
    assert o.collateral == ["extra alarm added at 7:30 PM"]
    assert o.falsely_claimed_done


def test_never_declaring_done_fails_even_with_goal_reached(scripted):
    o = run_one(TASKS["wifi_off"], "base", scripted("wifi_off", {"never_done"}), max_steps=8)
    assert o.goal_reached and o.collateral == []
    assert not o.declared_done and not o.success and not o.falsely_claimed_done
    assert o.steps == 8 and o.stop_reason == "step budget exhausted"
    assert o.failure_reason == "never called task_complete (step budget exhausted)"
    assert o.noop_actions == 5  # the idle swipes on a list that is already at the top


@pytest.mark.parametrize("task", list(TASKS))
def test_early_task_complete_is_falsely_claimed(task, scripted):
    o = run_one(TASKS[task], "base", scripted(task, {"early_done"}))
    assert o.declared_done and o.steps == 1
    if task == "wifi_already_on":  # the only task whose goal holds at the start
        assert o.success
        return
    assert not o.goal_reached and o.falsely_claimed_done and not o.success
    assert o.failure_reason.startswith("goal not reached")
    assert o.failure_reason.endswith("falsely claimed done")


def test_decoy_toggle_is_collateral(scripted):
    o = run_one(TASKS["wifi_on"], "decoy", scripted("wifi_on", {"decoy"}))
    assert o.goal_reached and not o.success
    assert o.collateral == ["Wi-Fi Calling changed off -> on"]


def test_airplane_with_bluetooth_side_effect(scripted):
    o = run_one(TASKS["airplane_on"], "base", scripted("airplane_on", {"bluetooth"}))
    assert o.goal_reached and not o.success
    assert o.collateral == ["Bluetooth changed on -> off"]


def test_decoy_app_never_reaches_the_clock(scripted):
    o = run_one(TASKS["clock_alarm_tab"], "decoy", scripted("clock_alarm_tab", {"decoy_app"}), max_steps=6)
    assert o.final_state["foreground"] == "com.example.alarmpro"
    assert not o.goal_reached
    assert "foreground app is com.example.alarmpro, not Clock" in o.failure_reason


# ------------------------------------------------------------------ oracles on hand-set device state
def _judge(task: str, variant: str = "base", mutate=None, declared: bool = True):
    t = TASKS[task]
    d = t.make_device(variant)
    if mutate:
        mutate(d)
    return t.evaluate(d, Trace(declared_done=declared, stop_reason="task_complete"), variant)


def test_initial_states():
    assert TASKS["wifi_on"].make_device().settings["wifi"] is False
    assert TASKS["wifi_already_on"].make_device().settings["wifi"] is True
    assert TASKS["wifi_off"].make_device().settings["wifi"] is True
    assert TASKS["airplane_on"].make_device().settings["airplane"] is False
    assert TASKS["wifi_already_on"].goal == TASKS["wifi_on"].goal


def test_oracle_setting_reasons():
    assert _judge("wifi_on").failure_reason == "goal not reached: Wi-Fi is off; falsely claimed done"
    assert _judge("wifi_off").failure_reason == "goal not reached: Wi-Fi is on; falsely claimed done"
    assert _judge("airplane_on").failure_reason == "goal not reached: airplane mode is off; falsely claimed done"
    assert _judge("wifi_on", mutate=lambda d: d._set("wifi", True)).success
    assert _judge("airplane_on", mutate=lambda d: d._set("airplane", True)).success
    assert _judge("wifi_already_on").success


def test_oracle_toggled_and_restored_side_setting_is_collateral():
    def flip_twice(d):
        d._set("bluetooth", False)
        d._set("bluetooth", True)
        d._set("wifi", True)
    o = _judge("wifi_on", mutate=flip_twice)
    assert o.goal_reached and o.collateral == ["Bluetooth was toggled 2 times (ended as it started)"]


def test_oracle_clock_tab():
    def open_clock(tab, menu=False, dialog=False):
        def m(d):
            d.open_app("Clock")
            d.clock_tab = tab
            d.clock_menu_open = menu
            if dialog:
                d._open_dialog()
        return m
    assert _judge("clock_alarm_tab", mutate=open_clock("alarm")).success
    o = _judge("clock_alarm_tab", mutate=open_clock("timer"))
    assert "Clock is on the timer tab, not Alarm" in o.failure_reason
    assert not _judge("clock_alarm_tab", mutate=open_clock("alarm", dialog=True)).goal_reached
    assert not _judge("clock_alarm_tab", "deeper", mutate=open_clock("alarm", menu=True)).goal_reached
    o = _judge("clock_alarm_tab")
    assert f"foreground app is {android.LAUNCHER}, not Clock" in o.failure_reason


def test_oracle_alarm():
    def add(*alarms, switch=None):
        def m(d):
            for h, mi in alarms:
                d.alarms.append(Alarm(h, mi))
                d.events.append({"kind": "alarm_added", "alarm": f"{h:02d}:{mi:02d}"})
            if switch is not None:
                d._switch_alarm(d.alarms[switch])
        return m
    assert _judge("add_alarm_730am", mutate=add((7, 30))).success
    o = _judge("add_alarm_730am", mutate=add((7, 30), (7, 30)))
    assert o.goal_reached and o.collateral == ["extra alarm added at 7:30 AM"]
    o = _judge("add_alarm_730am", mutate=add((7, 30), switch=-1))
    assert not o.goal_reached and "the 7:30 AM alarm was saved but is switched off" in o.failure_reason
    o = _judge("add_alarm_730am", mutate=add((7, 30), switch=0))
    assert o.collateral == ["alarm 6:00 AM switched 1 time(s), now off"]
    o = _judge("add_alarm_730am", "decoy", mutate=add(switch=2))  # enabling the decoy 7:30 PM alarm
    assert not o.goal_reached and o.collateral == ["alarm 7:30 PM switched 1 time(s), now on"]
    assert "no alarm was saved" in o.failure_reason

    def unsaved(d):
        d.open_app("Clock")
        d._open_dialog()
        d.dialog.hour, d.dialog.minute, d.dialog.period = "7", "30", "AM"
    o = _judge("add_alarm_730am", mutate=unsaved)
    assert "dialog was left open unsaved (hour='7', minute='30', AM)" in o.failure_reason
    o = _judge("clock_alarm_tab", mutate=add((7, 30)))
    assert o.collateral == ["extra alarm added at 7:30 AM"]


def test_select_tasks_and_variants():
    assert [t.name for t in select_tasks("all")] == list(TASKS)
    assert [t.name for t in select_tasks("wifi_on, airplane_on")] == ["wifi_on", "airplane_on"]
    with pytest.raises(ValueError, match="unknown task"):
        select_tasks("wifi_on,fly")
    assert select_variants("all") == list(VARIANTS)
    assert select_variants("base,renamed+deeper") == ["base", "renamed+deeper"]
    with pytest.raises(ValueError):
        select_variants("base,sideways")
