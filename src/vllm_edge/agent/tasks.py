"""Tasks and their oracles. A task is judged on device state, never on what the model says.

success = goal reached AND no collateral change AND the model declared done (task_complete).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from vllm_edge.agent import android
from vllm_edge.agent.device import VARIANTS, SimDevice, Variant
from vllm_edge.agent.loop import Trace

SETTING_NAMES = {"wifi": "Wi-Fi", "airplane": "airplane mode", "bluetooth": "Bluetooth",
                 "wifi_calling": "Wi-Fi Calling", "hotspot": "Wi-Fi hotspot"}


def _onoff(v: bool) -> str:
    return "on" if v else "off"


def _ampm(key: str) -> str:
    h, m = (int(x) for x in key.split(":"))
    return f"{h % 12 or 12}:{m:02d} {'AM' if h < 12 else 'PM'}"


@dataclass
class Outcome:
    task: str
    variant: str
    run: int
    success: bool
    goal_reached: bool
    collateral: list[str]
    declared_done: bool
    falsely_claimed_done: bool  # task_complete called, but the goal is not met or something else changed
    steps: int
    noop_actions: int
    self_undos: int
    recoveries: int
    recovery_kinds: dict[str, int] = field(default_factory=dict)
    failure_reason: str | None = None
    error: str | None = None  # chat or device failure, not a model failure
    stop_reason: str = ""
    final_state: dict[str, Any] = field(default_factory=dict)
    actions: list[dict] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


GoalCheck = Callable[[SimDevice], "tuple[bool, str]"]


@dataclass(frozen=True)
class Task:
    name: str
    goal: str  # what the model is told
    check_goal: GoalCheck  # (reached, reason if not)
    device_kwargs: dict = field(default_factory=dict)
    goal_settings: frozenset = frozenset()  # settings the task may change
    no_toggle: bool = False  # the goal is already met: touching goal_settings at all is collateral
    goal_alarm: str | None = None  # "HH:MM" of the one alarm the task may add

    def make_device(self, variant: str = "base") -> SimDevice:
        return SimDevice(variant, **self.device_kwargs)

    def collateral(self, device: SimDevice) -> list[str]:
        out: list[str] = []
        by_key: dict[str, list[dict]] = {}
        for ev in device.events:
            if ev["kind"] == "setting":
                by_key.setdefault(ev["key"], []).append(ev)
        for key, evs in by_key.items():
            name = SETTING_NAMES.get(key, key)
            if key in self.goal_settings and not self.no_toggle:
                continue
            if key in self.goal_settings:
                out.append(f"{name} was toggled {len(evs)} time(s) although it was already "
                           f"{_onoff(evs[0]['old'])}")
            elif device.settings[key] != evs[0]["old"]:
                out.append(f"{name} changed {_onoff(evs[0]['old'])} -> {_onoff(device.settings[key])}")
            else:
                out.append(f"{name} was toggled {len(evs)} times (ended as it started)")
        allowed = self.goal_alarm
        for ev in device.events:
            if ev["kind"] == "alarm_added":
                if ev["alarm"] == allowed:
                    allowed = None  # one is the goal; a second identical one is a duplicate
                else:
                    out.append(f"extra alarm added at {_ampm(ev['alarm'])}")
        switched: dict[str, int] = {}
        for ev in device.events:
            if ev["kind"] == "alarm_switched":
                switched[ev["alarm"]] = switched.get(ev["alarm"], 0) + 1
        for key, count in switched.items():
            now = next((a.enabled for a in reversed(device.alarms) if a.key() == key), None)
            if key == self.goal_alarm and any(e["kind"] == "alarm_added" and e["alarm"] == key
                                              for e in device.events):
                continue  # switching the alarm you just added is judged by the goal check
            out.append(f"alarm {_ampm(key)} switched {count} time(s), now {_onoff(bool(now))}")
        return out

    def evaluate(self, device: SimDevice, trace: Trace, variant: str = "base", run: int = 1) -> Outcome:
        reached, why = self.check_goal(device)
        collateral = self.collateral(device)
        achieved = reached and not collateral
        success = achieved and trace.declared_done
        reasons = []
        if not reached:
            reasons.append(f"goal not reached: {why}")
        if collateral:
            reasons.append("collateral: " + "; ".join(collateral))
        if not trace.declared_done:
            reasons.append(f"never called task_complete ({trace.stop_reason})")
        elif not achieved:
            reasons.append("falsely claimed done")
        if trace.error:
            reasons.append(f"error: {trace.error}")
        return Outcome(
            task=self.name, variant=variant, run=run, success=success, goal_reached=reached,
            collateral=collateral, declared_done=trace.declared_done,
            falsely_claimed_done=trace.declared_done and not achieved, steps=len(trace.steps),
            noop_actions=trace.noop_actions, self_undos=trace.self_undos, recoveries=trace.recoveries,
            recovery_kinds=trace.recovery_kinds, failure_reason=None if success else "; ".join(reasons),
            error=trace.error, stop_reason=trace.stop_reason, final_state=device.state(),
            actions=[{"tool": s.tool, "args": s.args, "result": s.result, "noop": s.noop,
                      "self_undo": s.self_undo, "recoveries": s.recoveries, "error": s.error}
                     for s in trace.steps],
        )


# ----------------------------------------------------------------------------- goal checks
def _setting_is(key: str, value: bool) -> GoalCheck:
    def check(d: SimDevice) -> tuple[bool, str]:
        ok = d.settings[key] == value
        return ok, "" if ok else f"{SETTING_NAMES[key]} is {_onoff(d.settings[key])}"
    return check


def _clock_on_alarm_tab(d: SimDevice) -> tuple[bool, str]:
    if d.foreground != android.CLOCK:
        return False, f"foreground app is {d.foreground}, not Clock"
    if d.clock_tab != "alarm":
        return False, f"Clock is on the {d.clock_tab} tab, not Alarm"
    if d.dialog is not None or d.clock_menu_open:
        return False, "a dialog or menu covers the Alarm tab"
    return True, ""


def _alarm_saved(key: str) -> GoalCheck:
    def check(d: SimDevice) -> tuple[bool, str]:
        added = [e["alarm"] for e in d.events if e["kind"] == "alarm_added"]
        if key in added:
            if any(a.key() == key and a.enabled for a in d.alarms):
                return True, ""
            return False, f"the {_ampm(key)} alarm was saved but is switched off"
        if added:
            return False, "alarm saved at " + ", ".join(_ampm(a) for a in added) + f", not {_ampm(key)}"
        if d.dialog is not None:
            dl = d.dialog
            return False, (f"the add-alarm dialog was left open unsaved (hour={dl.hour!r}, "
                           f"minute={dl.minute!r}, {dl.period})")
        return False, "no alarm was saved"
    return check


_WIFI_GOAL = "Make sure Wi-Fi is turned on."

TASKS: dict[str, Task] = {t.name: t for t in (
    Task("wifi_on", _WIFI_GOAL, _setting_is("wifi", True), {"wifi": False}, frozenset({"wifi"})),
    # Same words as wifi_on: the model must read the switch, not assume it has to tap it.
    Task("wifi_already_on", _WIFI_GOAL, _setting_is("wifi", True), {"wifi": True}, frozenset({"wifi"}),
         no_toggle=True),
    Task("wifi_off", "Turn off Wi-Fi.", _setting_is("wifi", False), {"wifi": True}, frozenset({"wifi"})),
    Task("airplane_on", "Turn on airplane mode.", _setting_is("airplane", True), {"airplane": False, "wifi": True},
         frozenset({"airplane"})),
    Task("clock_alarm_tab", "Open the Clock app on its Alarm tab.", _clock_on_alarm_tab),
    Task("add_alarm_730am", "Set an alarm for 7:30 AM in the Clock app.", _alarm_saved("07:30"),
         goal_alarm="07:30"),
)}


def select_tasks(spec: str) -> list[Task]:
    """'all' or a comma-separated list of task names."""
    if spec.strip() == "all":
        return list(TASKS.values())
    names = [s.strip() for s in spec.split(",") if s.strip()]
    unknown = [n for n in names if n not in TASKS]
    if unknown:
        raise ValueError(f"unknown task(s) {', '.join(unknown)}; known: {', '.join(TASKS)}")
    return [TASKS[n] for n in names]


def select_variants(spec: str) -> list[str]:
    """'all' or a comma-separated list of variants (a variant may combine others with '+')."""
    if spec.strip() == "all":
        return list(VARIANTS)
    out = [s.strip() for s in spec.split(",") if s.strip()]
    for v in out:
        Variant.from_name(v)  # raises on unknown names
    return out
