"""The simulated phone: screens, transitions, variants, and the XML it dumps."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from vllm_edge.agent import android, uitree
from vllm_edge.agent.device import Alarm, SimDevice, Variant


def tree(d: SimDevice) -> uitree.UiTree:
    return uitree.parse(d.dump_ui())


def el(d: SimDevice, label: str, cls: str | None = None) -> uitree.Element:
    for e in tree(d).elements:
        if e.label == label and (cls is None or e.cls == cls):
            return e
    raise AssertionError(f"no {label!r} on screen:\n{tree(d).text()}")


def labels(d: SimDevice) -> list[str]:
    return [e.label for e in tree(d).elements]


def tap(d: SimDevice, label: str, cls: str | None = None) -> None:
    d.tap(*el(d, label, cls).center)


def test_dump_is_uiautomator_xml():
    d = SimDevice()
    xml = d.dump_ui()
    assert xml.startswith("<?xml version='1.0' encoding='UTF-8' standalone='yes' ?><hierarchy rotation=\"0\">")
    root = ET.fromstring(xml)
    nodes = list(root.iter("node"))
    assert nodes
    required = {"index", "text", "resource-id", "class", "package", "content-desc", "checkable", "checked",
                "clickable", "enabled", "focusable", "focused", "scrollable", "long-clickable", "password",
                "selected", "bounds"}
    for n in nodes:
        assert required <= set(n.attrib), n.attrib
        assert n.get("package") == android.LAUNCHER
    settings_icon = next(n for n in nodes if n.get("text") == "Settings")
    assert settings_icon.get("clickable") == "true"
    assert settings_icon.get("bounds") == "[810,820][1080,1120]"


def test_xml_escapes_labels():
    d = SimDevice()
    d.open_app("Settings")
    xml = d.dump_ui()
    assert 'text="Sound &amp; vibration"' in xml
    ET.fromstring(xml)


def test_launcher_tap_opens_settings_and_back_returns_home():
    d = SimDevice()
    tap(d, "Settings")
    assert d.foreground == android.SETTINGS and d.screen == "main"
    assert "Wi-Fi" in labels(d)
    d.press_key("BACK")
    assert d.foreground == android.LAUNCHER
    assert "Clock" in labels(d)


def test_wifi_screen_toggle_changes_state_and_switch():
    d = SimDevice(wifi=False)
    d.open_app("Settings")
    tap(d, "Wi-Fi")
    assert d.screen == "wifi"
    row = el(d, "Use Wi-Fi")
    assert row.cls == "Switch" and row.checkable and not row.checked
    assert "To see available networks, turn Wi-Fi on." in labels(d)
    d.tap(*row.center)
    assert d.settings["wifi"] is True
    assert d.events == [{"kind": "setting", "key": "wifi", "old": False, "new": True}]
    assert el(d, "Use Wi-Fi").checked
    assert "HomeNet" in labels(d)
    d.press_key("BACK")
    assert d.screen == "main"
    assert el(d, "Wi-Fi").detail == "HomeNet"


def test_airplane_and_bluetooth_switch_rows():
    d = SimDevice()
    d.open_app("settings")
    tap(d, "Airplane mode")
    assert d.settings["airplane"] is True and d.settings["wifi"] is False
    assert el(d, "Airplane mode").checked
    tap(d, "Bluetooth")
    assert d.settings["bluetooth"] is False


def test_tapping_a_title_or_empty_space_changes_nothing():
    d = SimDevice()
    d.open_app("Settings")
    before = d.dump_ui()
    tap(d, "Settings", "TextView")  # the toolbar title
    d.tap(5, 5)
    assert d.dump_ui() == before and d.events == []


def test_home_key_and_nav_bar_buttons():
    d = SimDevice()
    d.open_app("Settings")
    tap(d, "Wi-Fi")
    d.tap(270, 2330)  # navigation bar Back
    assert d.screen == "main"
    d.tap(540, 2330)  # navigation bar Home
    assert d.foreground == android.LAUNCHER
    d.open_app("Settings")
    assert d.screen == "main"  # the app's back stack survives HOME
    tap(d, "Wi-Fi")
    d.press_key("HOME")
    d.open_app("Settings")
    assert d.screen == "wifi"


def test_open_app_by_label_canonical_name_and_package():
    d = SimDevice("renamed")
    d.open_app("Preferences")
    assert d.foreground == android.SETTINGS
    d.press_key("HOME")
    d.open_app("settings")  # canonical name still works, as on a real phone via adb
    assert d.foreground == android.SETTINGS
    d.open_app(android.CLOCK)
    assert d.foreground == android.CLOCK
    with pytest.raises(ValueError, match="not installed"):
        d.open_app("Alarm Pro")  # only the decoy variant installs it
    with pytest.raises(ValueError):
        d.open_app("com.example.nothing")


def test_settings_list_scrolls_and_reordered_hides_wifi_below_the_fold():
    d = SimDevice("reordered")
    d.open_app("Settings")
    t = tree(d)
    assert t.scrollable
    assert "Wi-Fi" not in labels(d)
    assert labels(d)[1] == "About phone"  # reversed order
    d.swipe(540, 1700, 540, 700)
    assert "Wi-Fi" in labels(d)
    d.swipe(540, 700, 540, 1700)
    assert "Wi-Fi" not in labels(d)
    before = d.dump_ui()
    d.swipe(540, 700, 540, 1700)  # already at the top
    assert d.dump_ui() == before


def test_renamed_labels():
    d = SimDevice("renamed")
    assert "Preferences" in labels(d) and "Alarms & Clock" in labels(d)
    d.open_app("Preferences")
    assert {"WLAN", "Flight mode"} <= set(labels(d))
    assert "Wi-Fi" not in labels(d)
    tap(d, "WLAN")
    assert "Use WLAN" in labels(d)
    d.press_key("HOME")
    d.open_app("Clock")
    assert "Alarms" in labels(d)


def test_decoys_are_separate_settings():
    d = SimDevice("decoy", wifi=False)
    d.open_app("Settings")
    assert labels(d)[1:5] == ["Wi-Fi Calling", "Wi-Fi", "Wi-Fi hotspot", "Airplane mode"]
    tap(d, "Wi-Fi Calling")
    assert d.settings["wifi_calling"] is True and d.settings["wifi"] is False
    tap(d, "Wi-Fi")
    assert labels(d)[:4] == ["Navigate up", "Wi-Fi", "Wi-Fi Calling", "Use Wi-Fi"]
    d.press_key("HOME")
    assert "Alarm Pro" in labels(d)
    tap(d, "Alarm Pro")
    assert d.foreground == "com.example.alarmpro"
    assert "Upgrade to Premium to set alarms" in labels(d)


def test_deeper_menus():
    d = SimDevice("deeper", wifi=False)
    assert labels(d) == ["Phone", "Messages", "Chrome", "Camera", "Apps list"]
    d.swipe(540, 1700, 540, 700)  # swipe up opens the app drawer
    assert "Settings" in labels(d)
    d.press_key("BACK")
    assert "Settings" not in labels(d)
    tap(d, "Apps list")
    tap(d, "Settings")
    assert "Wi-Fi" not in labels(d) and "Airplane mode" not in labels(d)
    tap(d, "Network & internet")
    assert d.screen == "network"
    tap(d, "Airplane mode")
    assert d.settings["airplane"]
    tap(d, "Wi-Fi")
    tap(d, "Use Wi-Fi")
    assert d.settings["wifi"]
    tap(d, "Navigate up")
    tap(d, "Navigate up")
    tap(d, "Connected devices")
    tap(d, "Bluetooth")
    assert d.settings["bluetooth"] is False


def test_clock_tabs_and_alarm_list():
    d = SimDevice()
    d.open_app("Clock")
    assert d.clock_tab == "clock"
    assert el(d, "Clock", "FrameLayout").selected
    tap(d, "Alarm", "FrameLayout")
    assert d.clock_tab == "alarm"
    assert {"6:00 AM", "8:15 AM", "Add alarm"} <= set(labels(d))
    sw = el(d, "8:15 AM", "Switch")
    assert not sw.checked
    d.tap(*sw.center)
    assert d.alarms[1] == Alarm(8, 15, True)
    assert d.events == [{"kind": "alarm_switched", "alarm": "08:15", "enabled": True}]


def test_deeper_clock_hides_alarm_tab_in_overflow_menu():
    d = SimDevice("deeper")
    d.open_app("Clock")
    assert "Alarm" not in labels(d)
    tap(d, "More options")
    assert labels(d)[:2] == ["Alarm", "Bedtime"]
    d.tap(100, 1500)  # outside the menu closes it
    assert "Alarm" not in labels(d) and d.clock_tab == "clock"
    tap(d, "More options")
    tap(d, "Alarm")
    assert d.clock_tab == "alarm" and not d.clock_menu_open


def _open_dialog(d: SimDevice) -> None:
    d.open_app("Clock")
    d.clock_tab = "alarm"
    tap(d, d.label("Add alarm"))
    assert d.dialog is not None


def test_add_alarm_dialog_730am():
    d = SimDevice()
    _open_dialog(d)
    assert labels(d)[0] == "Set alarm"  # only the dialog window is dumped
    d.type_text("7")  # nothing focused yet: goes nowhere
    assert d.dialog.hour == ""
    hour = el(d, "Hour", "EditText")
    assert hour.desc == "Hour"
    d.tap(*hour.center)
    assert el(d, "Hour", "EditText").focused
    d.type_text("7")
    d.press_key("ENTER")  # moves to the minute field
    d.type_text("3:0x")  # a number field keeps digits only
    assert (d.dialog.hour, d.dialog.minute) == ("7", "30")
    assert el(d, "PM", "RadioButton").checked  # starts on PM: the phone's clock says 2:05 PM
    tap(d, "AM", "RadioButton")
    assert el(d, "AM", "RadioButton").checked and not el(d, "PM", "RadioButton").checked
    tap(d, "Save", "Button")
    assert d.dialog is None and d.clock_tab == "alarm"
    assert Alarm(7, 30, True) in d.alarms
    assert d.events[-1] == {"kind": "alarm_added", "alarm": "07:30"}
    assert "7:30 AM" in labels(d)


def test_add_alarm_dialog_pm_default_validation_and_cancel():
    d = SimDevice()
    _open_dialog(d)
    tap(d, "Save", "Button")
    assert d.dialog is not None and "Enter an hour from 1 to 12" in labels(d)
    d.dialog.focus = "hour"
    d.type_text("13")
    tap(d, "Save", "Button")
    assert "Enter an hour from 1 to 12" in labels(d)
    d.press_key("DEL")
    d.press_key("DEL")
    d.type_text("7")
    d.dialog.focus = "minute"
    d.type_text("30")
    tap(d, "Save", "Button")
    assert Alarm(19, 30, True) in d.alarms  # PM left selected
    _open_dialog(d)
    tap(d, "Cancel", "Button")
    assert d.dialog is None
    _open_dialog(d)
    d.tap(540, 300)  # outside the dialog cancels it
    assert d.dialog is None
    _open_dialog(d)
    d.press_key("BACK")
    assert d.dialog is None and d.foreground == android.CLOCK
    assert [e["kind"] for e in d.events] == ["alarm_added"]


def test_reordered_dialog_puts_pm_first_and_renamed_dialog_labels():
    d = SimDevice("reordered")
    _open_dialog(d)
    radios = [e.label for e in tree(d).elements if e.cls == "RadioButton"]
    assert radios == ["PM", "AM"]
    buttons = [e.label for e in tree(d).elements if e.cls == "Button"]
    assert buttons == ["Save", "Cancel"]
    r = SimDevice("renamed")
    _open_dialog(r)
    assert {"New alarm", "a.m.", "p.m.", "OK", "Dismiss"} <= set(labels(r))
    assert [e.desc for e in tree(r).elements if e.cls == "EditText"] == ["Hours", "Minutes"]


def test_decoy_clock_has_a_730pm_alarm_and_bedtime_tab():
    d = SimDevice("decoy")
    d.open_app("Clock")
    assert "Bedtime" in labels(d)
    tap(d, "Alarm", "FrameLayout")
    assert "7:30 PM" in labels(d)


def test_variant_names():
    assert Variant.from_name("base") == Variant()
    assert Variant.from_name("renamed+deeper") == Variant(renamed=True, deeper=True)
    assert Variant.from_name("decoy").decoys
    with pytest.raises(ValueError, match="unknown variant"):
        Variant.from_name("upside-down")


def test_keys_by_name_and_code():
    d = SimDevice()
    d.open_app("Settings")
    d.press_key(4)
    assert d.foreground == android.LAUNCHER
    d.open_app("Settings")
    d.press_key("KEYCODE_HOME")
    assert d.foreground == android.LAUNCHER
    with pytest.raises(ValueError, match="unknown key"):
        d.press_key("TELEPORT")
