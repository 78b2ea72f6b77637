"""A simulated Android phone: phone state plus a uiautomator-style XML dump of the current screen.

It has the same interface as :class:`vllm_edge.agent.adb.AdbDevice`, so the agent loop cannot
tell them apart, but its state (Wi-Fi, airplane mode, alarms, what changed) is readable, which is
what the task oracles judge. Each render builds the node tree with tap handlers attached; a tap
hit-tests the same tree the dump showed, so coordinates mean the same thing as on a phone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterator
from xml.sax.saxutils import quoteattr

from vllm_edge.agent import android

WIDTH, HEIGHT = 1080, 2400
TOOLBAR = (96, 288)
NAV_TOP = 2256  # 3-button navigation bar; not part of the app window's dump
ROW_H = 200
BOTTOM_NAV = (2064, 2256)

ALARM_PRO = "com.example.alarmpro"
CLOCK_TABS = ("alarm", "clock", "timer", "stopwatch")

VARIANTS = ("base", "renamed", "reordered", "decoy", "deeper")

# Canonical label -> renamed label (the renamed variant uses synonyms a capable agent can map).
_RENAMED = {
    "Settings": "Preferences",
    "Clock": "Alarms & Clock",
    "Wi-Fi": "WLAN",
    "Use Wi-Fi": "Use WLAN",
    "Wi-Fi Calling": "WLAN Calling",
    "Wi-Fi hotspot": "WLAN hotspot",
    "Airplane mode": "Flight mode",
    "Network & internet": "Connections",
    "Wi-Fi, airplane mode, hotspot": "WLAN, flight mode, hotspot",
    "Alarm": "Alarms",
    "Add alarm": "New alarm",
    "Set alarm": "New alarm",
    "Save": "OK",
    "Cancel": "Dismiss",
    "AM": "a.m.",
    "PM": "p.m.",
    "Hour": "Hours",
    "Minute": "Minutes",
    "Apps list": "All apps",
    "Navigate up": "Back",
}


@dataclass(frozen=True)
class Variant:
    """Screen perturbations. Each is a constructor option; they can be combined."""

    renamed: bool = False  # synonyms for the labels an agent looks for
    reordered: bool = False  # lists, tabs, app grids and AM/PM in reverse order
    decoys: bool = False  # look-alike elements: Wi-Fi Calling, hotspot, an "Alarm Pro" app, a 7:30 PM alarm
    deeper: bool = False  # targets sit one menu level further down

    @classmethod
    def from_name(cls, name: str) -> "Variant":
        """'base', 'renamed', 'reordered', 'decoy', 'deeper', or a '+'-joined combination."""
        flags = {"renamed": "renamed", "reordered": "reordered", "decoy": "decoys",
                 "decoys": "decoys", "deeper": "deeper"}
        kwargs = {}
        for part in name.split("+"):
            part = part.strip()
            if part == "base":
                continue
            if part not in flags:
                raise ValueError(f"unknown variant {part!r}; known: {', '.join(VARIANTS)}")
            kwargs[flags[part]] = True
        return cls(**kwargs)


@dataclass(frozen=True)
class Alarm:
    hour: int  # 0-23
    minute: int
    enabled: bool = True

    def label(self, am: str = "AM", pm: str = "PM") -> str:
        h12 = self.hour % 12 or 12
        return f"{h12}:{self.minute:02d} {am if self.hour < 12 else pm}"

    def key(self) -> str:
        return f"{self.hour:02d}:{self.minute:02d}"


@dataclass
class AlarmDialog:
    hour: str = ""
    minute: str = ""
    period: str = "PM"  # the phone's clock reads 2:05 PM, so the picker starts on PM
    focus: str | None = None  # "hour" | "minute" | None
    error: str | None = None


@dataclass
class Node:
    cls: str
    bounds: tuple[int, int, int, int]
    text: str = ""
    rid: str = ""
    desc: str = ""
    clickable: bool = False
    checkable: bool = False
    checked: bool = False
    enabled: bool = True
    focusable: bool = False
    focused: bool = False
    scrollable: bool = False
    selected: bool = False
    children: list["Node"] = field(default_factory=list)
    on_tap: Callable[[], None] | None = None
    scroll_key: str | None = None

    def contains(self, x: int, y: int) -> bool:
        x1, y1, x2, y2 = self.bounds
        return x1 <= x < x2 and y1 <= y < y2

    def walk(self) -> Iterator["Node"]:
        yield self
        for c in self.children:
            yield from c.walk()


@dataclass
class Window:
    package: str
    root: Node
    on_outside_tap: Callable[[], None] | None = None


def _b(v: bool) -> str:
    return "true" if v else "false"


def _node_xml(node: Node, index: int, package: str, out: list[str]) -> None:
    x1, y1, x2, y2 = node.bounds
    attrs = [
        ("index", str(index)), ("text", node.text), ("resource-id", node.rid), ("class", node.cls),
        ("package", package), ("content-desc", node.desc), ("checkable", _b(node.checkable)),
        ("checked", _b(node.checked)), ("clickable", _b(node.clickable)), ("enabled", _b(node.enabled)),
        ("focusable", _b(node.focusable or node.clickable)), ("focused", _b(node.focused)),
        ("scrollable", _b(node.scrollable)), ("long-clickable", "false"), ("password", "false"),
        ("selected", _b(node.selected)), ("bounds", f"[{x1},{y1}][{x2},{y2}]"),
    ]
    out.append("<node " + " ".join(f"{k}={quoteattr(v)}" for k, v in attrs))
    if not node.children:
        out.append(" />")
        return
    out.append(">")
    for i, c in enumerate(node.children):
        _node_xml(c, i, package, out)
    out.append("</node>")


def to_xml(windows: list[Window]) -> str:
    out = ["<?xml version='1.0' encoding='UTF-8' standalone='yes' ?>", '<hierarchy rotation="0">']
    for i, w in enumerate(windows):
        _node_xml(w.root, i, w.package, out)
    out.append("</hierarchy>")
    return "".join(out)


class SimDevice:
    """A phone with Settings (Wi-Fi, airplane mode, Bluetooth), Clock (alarms) and a launcher."""

    def __init__(
        self,
        variant: Variant | str = "base",
        *,
        wifi: bool = False,
        airplane: bool = False,
        bluetooth: bool = True,
        wifi_calling: bool = False,
        hotspot: bool = False,
        alarms: list[Alarm] | None = None,
    ) -> None:
        self.variant = Variant.from_name(variant) if isinstance(variant, str) else variant
        self.settings: dict[str, bool] = {"wifi": wifi, "airplane": airplane, "bluetooth": bluetooth}
        if self.variant.decoys:
            self.settings.update(wifi_calling=wifi_calling, hotspot=hotspot)
        if alarms is None:
            alarms = [Alarm(6, 0, True), Alarm(8, 15, False)]
            if self.variant.decoys:
                alarms.append(Alarm(19, 30, False))
        self.alarms: list[Alarm] = list(alarms)
        # Every persistent change, in order; oracles read this for collateral damage.
        self.events: list[dict] = []
        self.foreground = android.LAUNCHER
        self.stacks: dict[str, list[str]] = {android.LAUNCHER: ["home"]}
        self.clock_tab = "clock"
        self.clock_menu_open = False
        self.dialog: AlarmDialog | None = None
        self.stopwatch_running = False
        self.scroll: dict[str, int] = {}
        self._scroll_max: dict[str, int] = {}

    # ----------------------------------------------------------------- labels and apps
    def label(self, canonical: str) -> str:
        return _RENAMED.get(canonical, canonical) if self.variant.renamed else canonical

    def _order(self, items: list) -> list:
        return list(reversed(items)) if self.variant.reordered else list(items)

    def installed_apps(self) -> list[tuple[str, str]]:
        """(label, package) in launcher order."""
        apps = [("Phone", "phone"), ("Messages", "messages"), ("Chrome", "chrome"), ("Camera", "camera"),
                ("Photos", "photos"), ("Calendar", "calendar")]
        if self.variant.decoys:
            apps.append(("Alarm Pro", None))
        apps += [("Clock", "clock"), ("Settings", "settings")]
        out = [(self.label(lbl), android.APPS[key] if key else ALARM_PRO) for lbl, key in apps]
        return self._order(out)

    def _app_label(self, package: str) -> str:
        for lbl, pkg in self.installed_apps():
            if pkg == package:
                return lbl
        return package

    # ----------------------------------------------------------------- state for oracles
    def snapshot(self) -> dict:
        return {"settings": dict(self.settings), "alarms": [a.key() + ("" if a.enabled else " off") for a in self.alarms]}

    def state(self) -> dict:
        """Persistent state plus where the UI is; recorded with each run."""
        d = self.dialog
        return {
            **self.snapshot(),
            "foreground": self.foreground,
            "screen": self.screen,
            "clock_tab": self.clock_tab,
            "dialog": None if d is None else {"hour": d.hour, "minute": d.minute, "period": d.period},
        }

    @property
    def screen(self) -> str:
        return self.stacks.get(self.foreground, ["main"])[-1]

    def _set(self, key: str, value: bool) -> None:
        old = self.settings[key]
        if old != value:
            self.settings[key] = value
            self.events.append({"kind": "setting", "key": key, "old": old, "new": value})

    def _toggle(self, key: str) -> Callable[[], None]:
        return lambda: self._set(key, not self.settings[key])

    # ----------------------------------------------------------------- navigation
    def _push(self, screen: str) -> Callable[[], None]:
        def go() -> None:
            self.stacks[self.foreground].append(screen)
        return go

    def _back(self) -> None:
        if self.clock_menu_open:
            self.clock_menu_open = False
        elif self.dialog is not None:
            self.dialog = None
        elif self.foreground == android.LAUNCHER:
            self.stacks[android.LAUNCHER] = ["home"]
        elif len(self.stacks[self.foreground]) > 1:
            self.stacks[self.foreground].pop()
        else:
            del self.stacks[self.foreground]  # the activity finishes
            self._go_home()

    def _go_home(self) -> None:
        self.clock_menu_open = False
        self.dialog = None
        self.foreground = android.LAUNCHER
        self.stacks[android.LAUNCHER] = ["home"]

    def _launch(self, package: str) -> None:
        self.clock_menu_open = False
        self.foreground = package
        self.stacks.setdefault(package, ["main"])

    # ----------------------------------------------------------------- device interface
    def dump_ui(self) -> str:
        return to_xml(self._render())

    def tap(self, x: int, y: int) -> None:
        x, y = int(x), int(y)
        if y >= NAV_TOP:  # the navigation bar's Back / Home / Overview buttons
            if 180 <= x < 360:
                self._back()
            elif 450 <= x < 630:
                self._go_home()
            return
        windows = self._render()
        for w in reversed(windows):
            if not w.root.contains(x, y):
                if w.on_outside_tap is not None:
                    w.on_outside_tap()
                    return
                continue
            target = None
            for n in w.root.walk():  # document order = drawing order, so the last hit is on top
                if n.clickable and n.enabled and n.contains(x, y):
                    target = n
            if target is not None and target.on_tap is not None:
                target.on_tap()
            return

    def type_text(self, text: str) -> None:
        d = self.dialog
        if d is None or d.focus is None:
            return  # nothing has input focus: the text goes nowhere
        digits = "".join(ch for ch in str(text) if ch.isdigit())  # number fields drop other keys
        cur = getattr(d, d.focus)
        setattr(d, d.focus, (cur + digits)[:2])
        d.error = None

    def swipe(self, x1: int, y1: int, x2: int, y2: int, duration_ms: int = 300) -> None:
        dx, dy = x2 - x1, y2 - y1
        if abs(dy) < 100 or abs(dy) < abs(dx):
            return
        if self.foreground == android.LAUNCHER and self.variant.deeper:
            self.stacks[android.LAUNCHER] = ["drawer" if dy < 0 else "home"]
            return
        for w in self._render():
            for n in w.root.walk():
                if n.scroll_key and n.contains(int(x1), int(y1)):
                    key = n.scroll_key
                    self.scroll[key] = max(0, min(self._scroll_max.get(key, 0), self.scroll.get(key, 0) - dy))
                    return

    def press_key(self, key: int | str) -> None:
        code = android.keycode(key)
        name = android.key_name(code)
        if name == "BACK" or name == "ESCAPE":
            self._back()
        elif name == "HOME":
            self._go_home()
        elif name == "ENTER" and self.dialog is not None:
            self.dialog.focus = "minute" if self.dialog.focus == "hour" else None
        elif name == "DEL" and self.dialog is not None and self.dialog.focus:
            f = self.dialog.focus
            setattr(self.dialog, f, getattr(self.dialog, f)[:-1])

    def open_app(self, name: str) -> None:
        wanted = android.normalise_app_name(name)
        for lbl, pkg in self.installed_apps():
            if wanted in (android.normalise_app_name(lbl), pkg.casefold()):
                self._launch(pkg)
                return
        pkg = android.resolve_package(name)
        if pkg in {p for _, p in self.installed_apps()}:
            self._launch(pkg)
            return
        raise ValueError(f"app {name!r} is not installed")

    # ----------------------------------------------------------------- rendering helpers
    def _text(self, text: str, bounds, rid: str = "", **kw) -> Node:
        return Node("android.widget.TextView", bounds, text=text, rid=rid, **kw)

    def _toolbar(self, title: str, back: bool = True) -> Node:
        kids = []
        if back:
            kids.append(Node("android.widget.ImageButton", (0, 96, 168, 288), desc=self.label("Navigate up"),
                             clickable=True, on_tap=self._back))
        kids.append(self._text(title, (192 if back else 48, 150, 900, 234)))
        return Node("android.view.ViewGroup", (0, TOOLBAR[0], WIDTH, TOOLBAR[1]),
                    rid=f"{self.foreground}:id/action_bar", children=kids)

    def _list(self, key: str, rows: list[Callable[[tuple[int, int, int, int]], Node]], top: int, bottom: int,
              row_h: int = ROW_H) -> Node:
        """A RecyclerView: only rows inside the viewport are dumped, clipped like a real dump."""
        content = len(rows) * row_h
        self._scroll_max[key] = max(0, content - (bottom - top))
        off = min(self.scroll.get(key, 0), self._scroll_max[key])
        kids = []
        for i, make in enumerate(rows):
            y1 = top + i * row_h - off
            y2 = y1 + row_h
            if y2 <= top or y1 >= bottom:
                continue
            kids.append(make((0, max(y1, top), WIDTH, min(y2, bottom))))
        return Node("androidx.recyclerview.widget.RecyclerView", (0, top, WIDTH, bottom), rid="android:id/list",
                    scrollable=self._scroll_max[key] > 0, children=kids, scroll_key=key)

    def _row(self, title: str, summary: str = "", on_tap=None, switch: bool | None = None):
        def make(b):
            x1, y1, x2, y2 = b
            kids = [self._text(title, (48, y1, 800, min(y2, y1 + 110)), rid="android:id/title")]
            if summary:
                kids.append(self._text(summary, (48, min(y1 + 110, y2 - 1), 800, y2), rid="android:id/summary"))
            if switch is not None:
                kids.append(Node("android.widget.Switch", (880, y1, 1032, y2), rid="android:id/switch_widget",
                                 checkable=True, checked=switch))
            return Node("android.widget.LinearLayout", b, clickable=on_tap is not None, on_tap=on_tap, children=kids)
        return make

    def _page(self, title: str, body: list[Node], back: bool = True) -> Node:
        return Node("android.widget.FrameLayout", (0, 0, WIDTH, HEIGHT), rid="android:id/content",
                    children=[self._toolbar(title, back), *body])

    # ----------------------------------------------------------------- screens
    def _render(self) -> list[Window]:
        pkg = self.foreground
        if pkg == android.LAUNCHER:
            root = self._launcher()
        elif pkg == android.SETTINGS:
            root = self._settings()
        elif pkg == android.CLOCK:
            root = self._clock()
        elif pkg == ALARM_PRO:
            root = self._alarm_pro()
        else:
            root = self._page(self._app_label(pkg), [self._text("Nothing here yet.", (48, 400, 1032, 500))],
                              back=False)
        # uiautomator dumps the focused window, so a dialog or popup hides the screen below it.
        if pkg == android.CLOCK and self.dialog is not None:
            return [self._alarm_dialog()]
        if pkg == android.CLOCK and self.clock_menu_open:
            return [self._clock_menu()]
        return [Window(pkg, root)]

    def _launcher(self) -> Node:
        screen = self.stacks[android.LAUNCHER][-1]
        apps = self.installed_apps()
        if self.variant.deeper:
            dock_names = {self.label(n) for n in ("Phone", "Messages", "Chrome", "Camera")}
            if screen == "home":
                apps = [a for a in apps if a[0] in dock_names]
        icons = []
        for i, (lbl, pkg) in enumerate(apps):
            col, row = i % 4, i // 4
            top = (1900 if self.variant.deeper and screen == "home" else 500) + row * 320
            b = (col * 270, top, col * 270 + 270, top + 300)
            icons.append(Node("android.widget.TextView", b, text=lbl, desc=lbl, rid=f"{android.LAUNCHER}:id/icon",
                              clickable=True, on_tap=(lambda p=pkg: self._launch(p))))
        kids = list(icons)
        if self.variant.deeper and screen == "home":
            kids.append(Node("android.widget.ImageView", (440, 1720, 640, 1860), desc=self.label("Apps list"),
                             rid=f"{android.LAUNCHER}:id/all_apps_handle", clickable=True,
                             on_tap=lambda: self.stacks.__setitem__(android.LAUNCHER, ["drawer"])))
        container = Node("android.view.ViewGroup", (0, 0, WIDTH, NAV_TOP),
                         rid=f"{android.LAUNCHER}:id/{'apps_view' if screen == 'drawer' else 'workspace'}",
                         children=kids)
        return Node("android.widget.FrameLayout", (0, 0, WIDTH, HEIGHT), children=[container])

    def _settings_entries(self, screen: str) -> list:
        v, L, s = self.variant, self.label, self.settings
        wifi = self._row(L("Wi-Fi"), "HomeNet" if s["wifi"] else "Off", self._push("wifi"))
        airplane = self._row(L("Airplane mode"), "", self._toggle("airplane"), switch=s["airplane"])
        bluetooth = self._row("Bluetooth", "", self._toggle("bluetooth"), switch=s["bluetooth"])
        decoys = []
        if v.decoys:
            decoys = [self._row(L("Wi-Fi Calling"), "Call over Wi-Fi" if not v.renamed else "Call over WLAN",
                                self._toggle("wifi_calling"), switch=s["wifi_calling"]),
                      self._row(L("Wi-Fi hotspot"), "", self._toggle("hotspot"), switch=s["hotspot"])]
        generic = [self._row(t, sub, self._push("page:" + t)) for t, sub in (
            ("Apps", "Recent apps, default apps"), ("Notifications", "Notification history"),
            ("Battery", "80%"), ("Storage", "34% used"), ("Sound & vibration", "Volume, haptics"),
            ("Display", "Dark theme, font size"), ("Wallpaper & style", "Colors, themed icons"),
            ("Security & privacy", "App security, device lock"), ("Location", "On"),
            ("About phone", "Pixel"))]
        if screen == "main" and not v.deeper:
            return [decoys[0], wifi, *decoys[1:], airplane, bluetooth, *generic] if decoys else \
                [wifi, airplane, bluetooth, *generic]
        if screen == "main":
            return [self._row(L("Network & internet"), L("Wi-Fi, airplane mode, hotspot"), self._push("network")),
                    self._row("Connected devices", "Bluetooth, pairing", self._push("connected")), *generic]
        if screen == "network":
            extra = [self._row("Mobile network", "Carrier", self._push("page:Mobile network")),
                     self._row("Data Saver", "Off", self._push("page:Data Saver"))]
            return [decoys[0], wifi, *decoys[1:], airplane, *extra] if decoys else [wifi, airplane, *extra]
        if screen == "connected":
            return [bluetooth, self._row("Pair new device", "", self._push("page:Pair new device"))]
        return []

    def _settings(self) -> Node:
        screen = self.screen
        L = self.label
        if screen == "wifi":
            rows = [self._row(L("Use Wi-Fi"), "", self._toggle("wifi"), switch=self.settings["wifi"])]
            if self.variant.decoys:
                rows.insert(0, self._row(L("Wi-Fi Calling"), "", self._toggle("wifi_calling"),
                                         switch=self.settings["wifi_calling"]))
            if self.settings["wifi"]:
                rows += [self._row(n, sub, self._push("page:" + n))
                         for n, sub in (("HomeNet", "Connected"), ("CoffeeShop", "Saved"), ("Neighbour-5G", "Secured"))]
            else:
                rows.append(self._row(f"To see available networks, turn {L('Wi-Fi')} on."))
            rows += [self._row("Network preferences", "", self._push("page:Network preferences")),
                     self._row("Saved networks", "2 networks", self._push("page:Saved networks"))]
            return self._page(L("Wi-Fi"), [self._list("settings:wifi", self._order(rows), TOOLBAR[1], NAV_TOP)])
        if screen.startswith("page:"):
            title = screen[5:]
            return self._page(title, [self._text("No options to change here.", (48, 340, 1032, 440))])
        titles = {"main": L("Settings"), "network": L("Network & internet"), "connected": "Connected devices"}
        rows = self._order(self._settings_entries(screen))
        return self._page(titles.get(screen, screen),
                          [self._list("settings:" + screen, rows, TOOLBAR[1], NAV_TOP)], back=screen != "main")

    def _clock_tabs(self) -> list[str]:
        tabs = list(CLOCK_TABS)
        if self.variant.deeper:
            tabs.remove("alarm")  # reached through the overflow menu instead
        if self.variant.decoys:
            tabs.append("bedtime")
        return self._order(tabs)

    def _tab_label(self, tab: str) -> str:
        return self.label(tab.capitalize())

    def _set_tab(self, tab: str) -> Callable[[], None]:
        def go() -> None:
            self.clock_tab = tab
            self.clock_menu_open = False
        return go

    def _clock(self) -> Node:
        tab = self.clock_tab
        kids: list[Node] = []
        top, bottom = TOOLBAR[1], BOTTOM_NAV[0]
        if tab == "alarm":
            alarms = sorted(self.alarms, key=lambda a: (a.hour, a.minute))
            rows = [self._alarm_row(a) for a in self._order(alarms)]
            kids.append(self._list("clock:alarms", rows, top, bottom, row_h=240))
            kids.append(Node("android.widget.ImageButton", (444, 1840, 636, 2020), desc=self.label("Add alarm"),
                             rid=f"{android.CLOCK}:id/fab", clickable=True, on_tap=self._open_dialog))
        elif tab == "clock":
            kids += [self._text("2:05 PM", (48, 500, 1032, 760), rid=f"{android.CLOCK}:id/digital_clock"),
                     self._text("Wed, Nov 29", (48, 780, 1032, 860), rid=f"{android.CLOCK}:id/date")]
        elif tab == "timer":
            kids += [self._text("00h 00m 00s", (48, 500, 1032, 760), rid=f"{android.CLOCK}:id/timer_setup_time"),
                     Node("android.widget.Button", (390, 1700, 690, 1880), text="Start", enabled=False,
                          clickable=True)]
        elif tab == "stopwatch":
            kids += [self._text("00:00.00", (48, 500, 1032, 760), rid=f"{android.CLOCK}:id/stopwatch_time_text"),
                     Node("android.widget.Button", (390, 1700, 690, 1880),
                          text="Pause" if self.stopwatch_running else "Start", clickable=True,
                          on_tap=lambda: setattr(self, "stopwatch_running", not self.stopwatch_running))]
        else:  # bedtime (decoy tab)
            kids += [self._text("Bedtime", (48, 500, 1032, 620)),
                     self._text("Set a regular bedtime and wake-up time", (48, 640, 1032, 740))]
        toolbar = Node("android.view.ViewGroup", (0, 96, WIDTH, 288), rid=f"{android.CLOCK}:id/toolbar", children=[
            self._text(self._tab_label(tab), (48, 150, 800, 234)),
            Node("android.widget.ImageView", (912, 96, 1080, 288), desc="More options", clickable=True, on_tap=lambda: setattr(self, "clock_menu_open", True)),
        ])
        tabs = self._clock_tabs()
        w = WIDTH // len(tabs)
        nav = []
        for i, t in enumerate(tabs):
            b = (i * w, BOTTOM_NAV[0], (i + 1) * w, BOTTOM_NAV[1])
            nav.append(Node("android.widget.FrameLayout", b, desc=self._tab_label(t), clickable=True,
                            selected=t == tab, on_tap=self._set_tab(t),
                            children=[self._text(self._tab_label(t), (b[0], b[1] + 100, b[2], b[3] - 20))]))
        bar = Node("com.google.android.material.bottomnavigation.BottomNavigationView",
                   (0, BOTTOM_NAV[0], WIDTH, BOTTOM_NAV[1]), rid=f"{android.CLOCK}:id/bottom_navigation",
                   children=nav)
        return Node("android.widget.FrameLayout", (0, 0, WIDTH, HEIGHT), rid="android:id/content",
                    children=[toolbar, *kids, bar])

    def _alarm_row(self, alarm: Alarm):
        am, pm = self.label("AM"), self.label("PM")

        def make(b):
            x1, y1, x2, y2 = b
            text = alarm.label(am, pm)
            return Node("android.view.ViewGroup", b, rid=f"{android.CLOCK}:id/alarm_item", children=[
                self._text(text, (48, y1, 700, min(y2, y1 + 150)), rid=f"{android.CLOCK}:id/digital_clock"),
                self._text("Every day" if alarm.enabled else "Not scheduled", (48, min(y1 + 150, y2 - 1), 700, y2)),
                Node("android.widget.Switch", (860, y1, 1032, y2), rid=f"{android.CLOCK}:id/onoff", desc=text,
                     checkable=True, checked=alarm.enabled, clickable=True,
                     on_tap=lambda: self._switch_alarm(alarm)),
            ])
        return make

    def _switch_alarm(self, alarm: Alarm) -> None:
        i = self.alarms.index(alarm)
        new = Alarm(alarm.hour, alarm.minute, not alarm.enabled)
        self.alarms[i] = new
        self.events.append({"kind": "alarm_switched", "alarm": alarm.key(), "enabled": new.enabled})

    def _clock_menu(self) -> Window:
        items = (["Alarm"] if self.variant.deeper else []) + ["Bedtime", "Settings", "Send feedback", "Help"]
        actions = {"Alarm": self._set_tab("alarm"), "Bedtime": self._set_tab("bedtime")}
        nodes = []
        for i, it in enumerate(items):
            b = (560, 120 + i * 150, 1060, 270 + i * 150)
            nodes.append(self._text(self.label(it), b, rid=f"{android.CLOCK}:id/title", clickable=True,
                                    on_tap=actions.get(it, self._close_menu)))
        root = Node("android.widget.ListView", (560, 120, 1060, 120 + 150 * len(items)), children=nodes)
        return Window(android.CLOCK, root, on_outside_tap=self._close_menu)

    def _close_menu(self) -> None:
        self.clock_menu_open = False

    # ----------------------------------------------------------------- add-alarm dialog
    def _open_dialog(self) -> None:
        self.dialog = AlarmDialog()

    def _focus(self, fieldname: str) -> Callable[[], None]:
        def go() -> None:
            assert self.dialog is not None
            self.dialog.focus = fieldname
        return go

    def _set_period(self, period: str) -> Callable[[], None]:
        def go() -> None:
            assert self.dialog is not None
            self.dialog.period = period
        return go

    def _save_dialog(self) -> None:
        d = self.dialog
        assert d is not None
        if not (d.hour.isdigit() and 1 <= int(d.hour) <= 12):
            d.error = "Enter an hour from 1 to 12"
            return
        if not (d.minute.isdigit() and 0 <= int(d.minute) <= 59):
            d.error = "Enter minutes from 00 to 59"
            return
        hour = int(d.hour) % 12 + (12 if d.period == "PM" else 0)
        alarm = Alarm(hour, int(d.minute), True)
        self.alarms.append(alarm)
        self.events.append({"kind": "alarm_added", "alarm": alarm.key()})
        self.dialog = None
        self.clock_tab = "alarm"

    def _alarm_dialog(self) -> Window:
        d = self.dialog
        assert d is not None
        L = self.label
        pkg = android.CLOCK
        kids = [self._text(L("Set alarm"), (120, 740, 960, 840), rid="android:id/alertTitle")]
        for name, x in (("hour", 120), ("minute", 600)):
            kids.append(Node("android.widget.EditText", (x, 880, x + 360, 1060), text=getattr(d, name),
                             desc=L(name.capitalize()), rid=f"{pkg}:id/{name}_input", clickable=True,
                             focusable=True, focused=d.focus == name, on_tap=self._focus(name)))
        kids.insert(2, self._text(":", (480, 880, 600, 1060)))
        periods = self._order(["AM", "PM"])
        radios = [Node("android.widget.RadioButton", (120 + i * 480, 1120, 480 + i * 480, 1260), text=L(p),
                       rid=f"{pkg}:id/{p.lower()}_label", checkable=True, checked=d.period == p, clickable=True,
                       on_tap=self._set_period(p)) for i, p in enumerate(periods)]
        kids.append(Node("android.widget.RadioGroup", (120, 1120, 960, 1260), children=radios))
        if d.error:
            kids.append(self._text(d.error, (120, 1300, 960, 1400), rid=f"{pkg}:id/error"))
        buttons = self._order([("Cancel", lambda: setattr(self, "dialog", None)), ("Save", self._save_dialog)])
        for i, (name, act) in enumerate(buttons):
            kids.append(Node("android.widget.Button", (440 + i * 270, 1540, 680 + i * 270, 1660), text=L(name),
                             rid=f"android:id/button{2 - i}", clickable=True, on_tap=act))
        root = Node("android.widget.FrameLayout", (60, 700, 1020, 1700), rid="android:id/content", children=kids)
        return Window(pkg, root, on_outside_tap=lambda: setattr(self, "dialog", None))

    # ----------------------------------------------------------------- decoy app
    def _alarm_pro(self) -> Node:
        return self._page("Alarm Pro", [
            self._text("Upgrade to Premium to set alarms", (48, 400, 1032, 520)),
            Node("android.widget.Button", (140, 1600, 940, 1760), text="Upgrade", clickable=True),
            Node("android.widget.Button", (140, 1800, 940, 1960), text="Not now", clickable=True,
                 on_tap=self._back),
        ], back=False)
