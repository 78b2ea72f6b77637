"""uiautomator XML -> indexed element list, and index -> tap point."""

from __future__ import annotations

import pytest

from vllm_edge.agent import uitree
from vllm_edge.agent.device import SimDevice

# Shaped like a real Settings dump: clickable rows whose title, summary and switch are children.
REAL = """UI hierchary dumped to: /dev/tty
<?xml version='1.0' encoding='UTF-8' standalone='yes' ?><hierarchy rotation="0">
<node index="0" text="" resource-id="" class="android.widget.FrameLayout" package="com.android.settings" content-desc="" checkable="false" checked="false" clickable="false" enabled="true" focusable="false" focused="false" scrollable="false" long-clickable="false" password="false" selected="false" bounds="[0,0][1080,2400]">
 <node index="0" text="" resource-id="" class="android.widget.ImageButton" package="com.android.settings" content-desc="Navigate up" checkable="false" checked="false" clickable="true" enabled="true" focusable="true" focused="false" scrollable="false" long-clickable="false" password="false" selected="false" bounds="[0,96][168,264]" />
 <node index="1" text="Internet" resource-id="" class="android.widget.TextView" package="com.android.settings" content-desc="" checkable="false" checked="false" clickable="false" enabled="true" focusable="false" focused="false" scrollable="false" long-clickable="false" password="false" selected="false" bounds="[189,142][420,218]" />
 <node index="2" text="" resource-id="com.android.settings:id/recycler_view" class="androidx.recyclerview.widget.RecyclerView" package="com.android.settings" content-desc="" checkable="false" checked="false" clickable="false" enabled="true" focusable="true" focused="false" scrollable="true" long-clickable="false" password="false" selected="false" bounds="[0,264][1080,2337]">
  <node index="0" text="" resource-id="" class="android.widget.LinearLayout" package="com.android.settings" content-desc="" checkable="false" checked="false" clickable="true" enabled="true" focusable="true" focused="false" scrollable="false" long-clickable="false" password="false" selected="false" bounds="[0,264][1080,480]">
   <node index="0" text="Wi-Fi" resource-id="android:id/title" class="android.widget.TextView" package="com.android.settings" content-desc="" checkable="false" checked="false" clickable="false" enabled="true" focusable="false" focused="false" scrollable="false" long-clickable="false" password="false" selected="false" bounds="[189,300][400,360]" />
   <node index="1" text="" resource-id="android:id/switch_widget" class="android.widget.Switch" package="com.android.settings" content-desc="" checkable="true" checked="true" clickable="false" enabled="true" focusable="false" focused="false" scrollable="false" long-clickable="false" password="false" selected="false" bounds="[900,320][1032,420]" />
  </node>
  <node index="1" text="" resource-id="" class="android.widget.LinearLayout" package="com.android.settings" content-desc="" checkable="false" checked="false" clickable="true" enabled="false" focusable="true" focused="false" scrollable="false" long-clickable="false" password="false" selected="false" bounds="[0,480][1080,700]">
   <node index="0" text="Home &amp; &quot;Work&quot;" resource-id="android:id/title" class="android.widget.TextView" package="com.android.settings" content-desc="" checkable="false" checked="false" clickable="false" enabled="true" focusable="false" focused="false" scrollable="false" long-clickable="false" password="false" selected="false" bounds="[189,500][700,560]" />
   <node index="1" text="Connected" resource-id="android:id/summary" class="android.widget.TextView" package="com.android.settings" content-desc="" checkable="false" checked="false" clickable="false" enabled="true" focusable="false" focused="false" scrollable="false" long-clickable="false" password="false" selected="false" bounds="[189,560][700,620]" />
   <node index="2" text="" resource-id="com.android.settings:id/settings_button" class="android.widget.ImageView" package="com.android.settings" content-desc="Settings" checkable="false" checked="false" clickable="true" enabled="true" focusable="true" focused="false" scrollable="false" long-clickable="false" password="false" selected="false" bounds="[920,520][1040,660]" />
  </node>
  <node index="2" text="hidden" resource-id="" class="android.widget.TextView" package="com.android.settings" content-desc="" checkable="false" checked="false" clickable="true" enabled="true" focusable="false" focused="false" scrollable="false" long-clickable="false" password="false" selected="false" bounds="[0,0][0,0]" />
  <node index="3" text="" resource-id="com.android.settings:id/fab" class="android.widget.ImageButton" package="com.android.settings" content-desc="" checkable="false" checked="false" clickable="true" enabled="true" focusable="true" focused="false" scrollable="false" long-clickable="false" password="false" selected="false" bounds="[800,2000][1000,2200]" />
 </node>
</node>
</hierarchy>
"""


def test_parse_folds_rows_and_keeps_nested_buttons():
    t = uitree.parse(REAL)
    assert t.package == "com.android.settings"
    assert t.scrollable
    assert [e.describe() for e in t.elements] == [
        '[0] ImageButton "Navigate up"',
        '[1] TextView "Internet"',
        '[2] Switch "Wi-Fi" [on]',
        "[3] LinearLayout \"Home & 'Work'\" — Connected [disabled]",
        '[4] ImageView "Settings"',
        "[5] ImageButton id=fab",
    ]
    assert not t.elements[1].clickable and t.elements[2].clickable


def test_text_output_has_app_and_scroll_hint():
    text = uitree.parse(REAL).text()
    assert text.splitlines()[0] == "App: com.android.settings"
    assert "swipe up to see more" in text.splitlines()[-1]


def test_index_to_bounds_centre():
    t = uitree.parse(REAL)
    assert t.tap_point(2) == (540, 372)  # the whole row [0,264][1080,480], not the switch
    assert t.tap_point(0) == (84, 180)
    with pytest.raises(IndexError, match="valid indices are 0-5"):
        t.tap_point(6)
    with pytest.raises(IndexError, match="valid indices"):
        t.tap_point(-1)
    with pytest.raises(IndexError, match="integer"):
        t.tap_point("2")  # type: ignore[arg-type]


def test_tapping_the_centre_of_every_simulator_element_hits_it():
    d = SimDevice()
    d.open_app("Settings")
    t = uitree.parse(d.dump_ui())
    row = next(e for e in t.elements if e.label == "Airplane mode")
    d.tap(*t.tap_point(row.index))
    assert d.settings["airplane"]


@pytest.mark.parametrize("bad", ["", "no xml here", "<hierarchy><node bounds=</hierarchy>"])
def test_parse_errors_are_clear(bad):
    with pytest.raises(uitree.UiParseError):
        uitree.parse(bad)


def test_empty_screen():
    t = uitree.parse('<hierarchy rotation="0"></hierarchy>')
    assert t.elements == [] and "(no elements on screen)" in t.text()
    with pytest.raises(IndexError, match="no elements"):
        t.tap_point(0)
