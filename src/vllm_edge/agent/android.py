"""Android names shared by the simulator and the adb backend: key codes and app packages."""

from __future__ import annotations

# android.view.KeyEvent constants for the keys an agent needs.
KEYCODES: dict[str, int] = {
    "HOME": 3,
    "BACK": 4,
    "DPAD_UP": 19,
    "DPAD_DOWN": 20,
    "DPAD_LEFT": 21,
    "DPAD_RIGHT": 22,
    "DPAD_CENTER": 23,
    "VOLUME_UP": 24,
    "VOLUME_DOWN": 25,
    "POWER": 26,
    "TAB": 61,
    "SPACE": 62,
    "ENTER": 66,
    "DEL": 67,
    "MENU": 82,
    "SEARCH": 84,
    "ESCAPE": 111,
    "APP_SWITCH": 187,
}
_NAMES_BY_CODE = {code: name for name, code in KEYCODES.items()}
_KEY_ALIASES = {"BACKSPACE": "DEL", "DELETE": "DEL", "RETURN": "ENTER", "RECENTS": "APP_SWITCH", "ESC": "ESCAPE"}

LAUNCHER = "com.android.launcher3"
SETTINGS = "com.android.settings"
CLOCK = "com.google.android.deskclock"

# Canonical app names -> packages. Labels on screen may differ (renamed variants,
# OEM skins); these names are what a task description or a model will say.
APPS: dict[str, str] = {
    "settings": SETTINGS,
    "clock": CLOCK,
    "phone": "com.google.android.dialer",
    "messages": "com.google.android.apps.messaging",
    "chrome": "com.android.chrome",
    "camera": "com.android.camera2",
    "calendar": "com.google.android.calendar",
    "photos": "com.google.android.apps.photos",
}


def keycode(key: int | str) -> int:
    """Key name ('BACK', 'KEYCODE_BACK', 'back') or number -> Android key code."""
    if isinstance(key, bool):
        raise ValueError(f"not a key: {key!r}")
    if isinstance(key, int):
        return key
    name = str(key).strip().upper()
    if name.isdigit():
        return int(name)
    name = name.removeprefix("KEYCODE_")
    name = _KEY_ALIASES.get(name, name)
    if name not in KEYCODES:
        raise ValueError(f"unknown key {key!r}; known: {', '.join(KEYCODES)}")
    return KEYCODES[name]


def key_name(code: int) -> str | None:
    return _NAMES_BY_CODE.get(code)


def normalise_app_name(name: str) -> str:
    return " ".join(str(name).replace("_", " ").split()).casefold()


def resolve_package(name: str, extra: dict[str, str] | None = None) -> str | None:
    """A package name passes through; a known app name maps to its package; else None."""
    name = str(name).strip()
    if not name:
        return None
    table = {normalise_app_name(k): v for k, v in {**APPS, **(extra or {})}.items()}
    hit = table.get(normalise_app_name(name))
    if hit:
        return hit
    if "." in name and " " not in name:
        return name
    return None
