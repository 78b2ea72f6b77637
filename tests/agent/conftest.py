"""Scripted agents: chat callables that read the indexed element list and emit tool calls.

The reference agent knows the synonyms the renamed variant uses, so it must pass every task and
variant; the ``mistakes`` switch makes it fail in one specific way each.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

import pytest

LINE = re.compile(r'^\[(\d+)\] (\S+) "(.*?)"(?: desc="(.*?)")?(.*)$')

WIFI = {"Wi-Fi", "WLAN"}
USE_WIFI = {"Use Wi-Fi", "Use WLAN"}
WIFI_CALLING = {"Wi-Fi Calling", "WLAN Calling"}
AIRPLANE = {"Airplane mode", "Flight mode"}
NETWORK = {"Network & internet", "Connections"}
SETTINGS_APP = {"Settings", "Preferences"}
CLOCK_APP = {"Clock", "Alarms & Clock"}
ALARM_TAB = {"Alarm", "Alarms"}
ADD_ALARM = {"Add alarm", "New alarm"}
SAVE = {"Save", "OK"}
AM = {"AM", "a.m."}
PM = {"PM", "p.m."}
HOUR = {"Hour", "Hours"}
MINUTE = {"Minute", "Minutes"}
APPS_LIST = {"Apps list", "All apps"}
BLUETOOTH = {"Bluetooth"}


@dataclass
class El:
    index: int
    cls: str
    label: str
    desc: str
    flags: str

    @property
    def on(self) -> bool:
        return "[on]" in self.flags

    @property
    def checkable(self) -> bool:
        return "[on]" in self.flags or "[off]" in self.flags


def parse_screen(text: str) -> tuple[str, list[El], bool]:
    screen = text.rsplit("Current screen:\n", 1)[-1]
    lines = screen.splitlines()
    app = lines[0].removeprefix("App: ").strip()
    els = []
    for ln in lines[1:]:
        m = LINE.match(ln)
        if m:
            els.append(El(int(m.group(1)), m.group(2), m.group(3), m.group(4) or "", m.group(5)))
    return app, els, "This screen scrolls" in screen


def tool_call(_tool: str, **args) -> dict:
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": f"c{id(args)}", "type": "function", "function": {"name": _tool, "arguments": json.dumps(args)}}]}


@dataclass
class ScriptedAgent:
    """Screen-driven: decides each turn from the current element list alone (plus a few flags)."""

    task: str
    mistakes: set[str] = field(default_factory=set)
    use_open_app: bool = False
    turns: int = 0
    opened_dialog: bool = False
    toggled_once: bool = False
    decoy_tapped: bool = False
    undo_phase: int = 0
    seen_messages: list[list[dict]] = field(default_factory=list)

    def __call__(self, messages: list[dict], tools: list[dict]) -> dict:
        self.turns += 1
        self.seen_messages.append(messages)
        if "early_done" in self.mistakes:
            return tool_call("task_complete", summary="done")
        app, els, scrolls = parse_screen(messages[-1]["content"])
        return self.decide(app, els, scrolls)

    def finish(self) -> dict:
        if "never_done" in self.mistakes:
            return tool_call("swipe", direction="down")  # idles: the task is done but never declared
        return tool_call("task_complete", summary="done")

    def find(self, els: list[El], labels: set[str], cls: str | None = None) -> El | None:
        for e in els:
            if (e.label in labels or e.desc in labels) and (cls is None or e.cls == cls):
                return e
        return None

    def tap(self, e: El) -> dict:
        return tool_call("tap", index=e.index)

    def from_launcher(self, els: list[El], app_labels: set[str], app_name: str) -> dict:
        if self.use_open_app:
            return tool_call("open_app", name=app_name)
        if "decoy_app" in self.mistakes and (e := self.find(els, {"Alarm Pro"})):
            return self.tap(e)
        e = self.find(els, app_labels)
        if e:
            return self.tap(e)
        e = self.find(els, APPS_LIST)
        return self.tap(e) if e else tool_call("swipe", direction="up")

    def decide(self, app: str, els: list[El], scrolls: bool) -> dict:
        if self.task in ("wifi_on", "wifi_already_on", "wifi_off", "airplane_on"):
            if app == "com.android.launcher3":
                return self.from_launcher(els, SETTINGS_APP, "Settings")
            return self.settings(els, scrolls)
        if app == "com.android.launcher3":
            return self.from_launcher(els, CLOCK_APP, "Clock")
        if app != "com.google.android.deskclock":
            if "decoy_app" in self.mistakes:
                return self.finish()  # believes the look-alike alarm app is the Clock
            return tool_call("press_key", key="HOME")
        return self.clock(els)

    def settings(self, els: list[El], scrolls: bool) -> dict:
        if "decoy" in self.mistakes and not self.decoy_tapped and (e := self.find(els, WIFI_CALLING)):
            self.decoy_tapped = True
            return self.tap(e)
        if "bluetooth" in self.mistakes and not self.toggled_once and (e := self.find(els, BLUETOOTH)):
            self.toggled_once = True
            return self.tap(e)
        if self.task == "airplane_on":
            target, want = self.find(els, AIRPLANE), True
        else:
            target, want = self.find(els, USE_WIFI), self.task != "wifi_off"
        if target and target.checkable:
            if "toggle_anyway" in self.mistakes and not self.toggled_once:
                self.toggled_once = True
                return self.tap(target)
            if "undo" in self.mistakes and self.undo_phase < 1 and target.on == want:
                self.undo_phase += 1  # flips it away, then back: two self-undos in a row
                return self.tap(target)
            if target.on == want:
                return self.finish()
            return self.tap(target)
        e = self.find(els, WIFI if self.task != "airplane_on" else set()) or self.find(els, NETWORK)
        if e:
            return self.tap(e)
        return tool_call("swipe", direction="up")

    def clock(self, els: list[El]) -> dict:
        hour = self.find(els, HOUR, "EditText")
        if hour:  # the add-alarm dialog
            minute = self.find(els, MINUTE, "EditText")
            for fld, want in ((hour, "7"), (minute, "30")):
                if fld.label != want:
                    if "[focused]" not in fld.flags:
                        return self.tap(fld)
                    if fld.label:
                        return tool_call("press_key", key="DEL")
                    return tool_call("type_text", text=want)
            period = self.find(els, PM if "pm" in self.mistakes else AM, "RadioButton")
            if not period.on:
                return self.tap(period)
            return self.tap(self.find(els, SAVE, "Button"))
        add = self.find(els, ADD_ALARM)
        if add:  # on the Alarm tab
            if self.task == "clock_alarm_tab" or self.find(els, {"7:30 AM", "7:30 a.m."}) or self.opened_dialog:
                return self.finish()
            self.opened_dialog = True
            return self.tap(add)
        tab = self.find(els, ALARM_TAB) or self.find(els, {"More options"})
        return self.tap(tab) if tab else tool_call("press_key", key="BACK")


@pytest.fixture
def scripted():
    return ScriptedAgent


@pytest.fixture
def screen_parser():
    return parse_screen
