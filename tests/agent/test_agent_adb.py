"""The adb backend against a fake transport: exact argv, canned output, clear errors."""

from __future__ import annotations

import shlex

import pytest

from vllm_edge.agent import android
from vllm_edge.agent.adb import AdbDevice, AdbError, RunResult, escape_input_text
from vllm_edge.agent.device import SimDevice
from vllm_edge.agent.loop import run_agent
from vllm_edge.agent.tasks import TASKS

XML = ("<?xml version='1.0' encoding='UTF-8' standalone='yes' ?><hierarchy rotation=\"0\">"
       '<node index="0" text="Hi" class="android.widget.TextView" package="p" bounds="[0,0][10,10]" /></hierarchy>')


class FakeAdb:
    def __init__(self, replies=None):
        self.argv: list[list[str]] = []
        self.replies = replies or {}

    def __call__(self, argv):
        self.argv.append(list(argv))
        for key, res in self.replies.items():
            if key in " ".join(argv):
                return res
        if "uiautomator" in argv:
            return RunResult(0, "UI hierchary dumped to: /sdcard/window_dump.xml\n")
        if argv[-2:] == ["cat", "/sdcard/window_dump.xml"]:
            return RunResult(0, XML)
        return RunResult(0, "")


def test_actions_send_exact_argv():
    t = FakeAdb()
    d = AdbDevice(serial="emulator-5554", transport=t)
    assert d.dump_ui() == XML
    d.tap(540.6, 1200)
    d.swipe(540, 1700, 540, 700)
    d.swipe(1, 2, 3, 4, duration_ms=50)
    d.type_text("it's 7:30 am")
    d.press_key("BACK")
    d.press_key(66)
    d.open_app("Clock")
    d.open_app("com.example.app/.Main")
    s = ["adb", "-s", "emulator-5554"]
    assert t.argv == [
        s + ["shell", "uiautomator", "dump", "/sdcard/window_dump.xml"],
        s + ["exec-out", "cat", "/sdcard/window_dump.xml"],
        s + ["shell", "input", "tap", "540", "1200"],
        s + ["shell", "input", "swipe", "540", "1700", "540", "700", "300"],
        s + ["shell", "input", "swipe", "1", "2", "3", "4", "50"],
        s + ["shell", "input", "text", "it\\'s%s7:30%sam"],
        s + ["shell", "input", "keyevent", "4"],
        s + ["shell", "input", "keyevent", "66"],
        s + ["shell", "monkey", "-p", android.CLOCK, "-c", "android.intent.category.LAUNCHER", "1"],
        s + ["shell", "am", "start", "-n", "com.example.app/.Main"],
    ]


def test_no_serial_and_custom_adb_path():
    t = FakeAdb()
    AdbDevice(adb="/opt/pt/adb", transport=t).press_key("HOME")
    assert t.argv == [["/opt/pt/adb", "shell", "input", "keyevent", "3"]]


@pytest.mark.parametrize("text", ["hello world", "a&b|c;d", "(x) $HOME `id` \"q\" 'q' <>*?~!#", "50%"])
def test_escaped_text_survives_the_device_shell(text):
    # adb joins the argv and the device's sh parses it; `input text` then turns %s into spaces.
    esc = escape_input_text(text)
    [word] = shlex.split(esc)
    assert word.replace("%s", " ") == text


@pytest.mark.parametrize("bad", ["", "line\nbreak", "café"])
def test_untypeable_text_is_refused(bad):
    with pytest.raises(ValueError):
        escape_input_text(bad)


def test_adb_failure_is_a_clear_error():
    t = FakeAdb({"input tap": RunResult(1, "", "error: no devices/emulators found")})
    with pytest.raises(AdbError, match=r"`adb shell input tap 1 2` failed with exit code 1: error: no devices"):
        AdbDevice(transport=t).tap(1, 2)


def test_uiautomator_failure_and_garbage_dump():
    t = FakeAdb({"uiautomator": RunResult(0, "ERROR: could not get idle state.")})
    with pytest.raises(AdbError, match="uiautomator dump failed: ERROR: could not get idle state"):
        AdbDevice(transport=t).dump_ui()
    t = FakeAdb({"exec-out": RunResult(0, "cat: /sdcard/window_dump.xml: No such file")})
    with pytest.raises(AdbError, match="not a UI dump"):
        AdbDevice(transport=t).dump_ui()


def test_open_app_errors():
    t = FakeAdb({"monkey": RunResult(0, "** No activities found to run, monkey aborted.")})
    with pytest.raises(ValueError, match="not installed"):
        AdbDevice(transport=t).open_app("com.missing.app")
    with pytest.raises(ValueError, match="unknown app 'Frobnicator'"):
        AdbDevice(transport=FakeAdb()).open_app("Frobnicator")
    t = FakeAdb()
    AdbDevice(transport=t, apps={"Notes": "org.notes"}).open_app("notes")
    assert t.argv[0][3:5] == ["-p", "org.notes"]


def test_missing_adb_binary():
    with pytest.raises(AdbError, match="not found"):
        AdbDevice(adb="/nonexistent/adb").tap(1, 1)


class PhoneOverAdb:
    """A transport that plays a SimDevice the way a phone plays adb commands."""

    def __init__(self, phone: SimDevice):
        self.phone, self.file = phone, ""

    def __call__(self, argv):
        args = argv[1:]
        sh = shlex.split(" ".join(args[1:])) if args[0] == "shell" else []
        if sh[:2] == ["uiautomator", "dump"]:
            self.file = self.phone.dump_ui()
            return RunResult(0, f"UI hierchary dumped to: {sh[2]}\n")
        if args[:2] == ["exec-out", "cat"]:
            return RunResult(0, self.file)
        if sh[:2] == ["input", "tap"]:
            self.phone.tap(int(sh[2]), int(sh[3]))
        elif sh[:2] == ["input", "swipe"]:
            self.phone.swipe(*map(int, sh[2:7]))
        elif sh[:2] == ["input", "text"]:
            self.phone.type_text(sh[2].replace("%s", " "))
        elif sh[:2] == ["input", "keyevent"]:
            self.phone.press_key(int(sh[2]))
        elif sh[:1] == ["monkey"]:
            self.phone.open_app(sh[2])
        else:
            return RunResult(1, "", f"unknown command {argv}")
        return RunResult(0, "")


@pytest.mark.parametrize("task", ["wifi_on", "add_alarm_730am"])
def test_the_loop_drives_a_phone_through_adb(task, scripted):
    phone = TASKS[task].make_device("deeper")
    adb = AdbDevice(transport=PhoneOverAdb(phone))
    trace = run_agent(adb, TASKS[task].goal, scripted(task, use_open_app=True))
    o = TASKS[task].evaluate(phone, trace, "deeper")
    assert o.success, o.failure_reason
    assert o.steps >= 3


def test_adb_failure_mid_run_is_an_error_not_a_model_failure(scripted):
    phone = TASKS["wifi_on"].make_device()
    transport = PhoneOverAdb(phone)

    def flaky(argv):
        if "tap" in argv:
            return RunResult(255, "", "error: device offline")
        return transport(argv)
    trace = run_agent(AdbDevice(transport=flaky), TASKS["wifi_on"].goal, scripted("wifi_on"))
    assert trace.stop_reason == "device error" and "device offline" in trace.error
