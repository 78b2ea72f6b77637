"""Drive a real Android phone over `adb`, with the same interface as the simulator.

Every command goes through an injectable transport (argv -> result), so tests can record the
exact argv and return canned output without a phone.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from typing import Callable

from vllm_edge.agent import android
from vllm_edge.common.errors import EdgeError


@dataclass
class RunResult:
    returncode: int
    stdout: str
    stderr: str = ""


Transport = Callable[[list[str]], RunResult]


class AdbError(EdgeError, RuntimeError):
    """adb itself failed (no device, command error): not something an agent can fix."""


def subprocess_transport(timeout: float = 30.0) -> Transport:
    def run(argv: list[str]) -> RunResult:
        try:
            p = subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=timeout)
        except FileNotFoundError as exc:
            raise AdbError(f"{argv[0]!r} not found: install Android platform-tools or pass adb=PATH") from exc
        except subprocess.TimeoutExpired as exc:
            raise AdbError(f"{' '.join(argv)} timed out after {timeout:g}s") from exc
        return RunResult(p.returncode, p.stdout, p.stderr)
    return run


# Characters the device shell would interpret; `input text` itself needs spaces as %s.
_SHELL_SPECIAL = set("\\'\"`$&|;<>()[]{}*?~!#^")


def escape_input_text(text: str) -> str:
    """Make ``text`` survive `adb shell input text`: spaces become %s, shell metacharacters are
    backslash-escaped. A literal "%s" in the text cannot be typed (input would turn it into a space)."""
    if not text:
        raise ValueError("nothing to type")
    out = []
    for ch in text:
        if ch == " ":
            out.append("%s")
        elif ch in ("\n", "\r", "\t") or not ch.isprintable():
            raise ValueError(f"`input text` cannot type control character {ch!r}; use press_key (ENTER, TAB)")
        elif ord(ch) > 127:
            raise ValueError(f"`input text` types ASCII only; cannot type {ch!r}")
        elif ch in _SHELL_SPECIAL:
            out.append("\\" + ch)
        else:
            out.append(ch)
    return "".join(out)


class AdbDevice:
    def __init__(
        self,
        serial: str | None = None,
        adb: str = "adb",
        transport: Transport | None = None,
        dump_path: str = "/sdcard/window_dump.xml",
        apps: dict[str, str] | None = None,
    ) -> None:
        self.serial = serial
        self.adb = adb
        self.transport = transport or subprocess_transport()
        self.dump_path = dump_path
        self.apps = dict(apps or {})  # extra name -> package entries for open_app

    def _argv(self, *args: str) -> list[str]:
        return [self.adb, *(["-s", self.serial] if self.serial else []), *args]

    def _run(self, *args: str) -> str:
        argv = self._argv(*args)
        res = self.transport(argv)
        if res.returncode != 0:
            detail = (res.stderr or res.stdout).strip() or "no output"
            raise AdbError(f"`{' '.join(argv)}` failed with exit code {res.returncode}: {detail}")
        return res.stdout

    def dump_ui(self) -> str:
        out = self._run("shell", "uiautomator", "dump", self.dump_path)
        # uiautomator exits 0 even when it fails, and says so on stdout.
        if "ERROR" in out or "dumped to" not in out:
            raise AdbError(f"uiautomator dump failed: {out.strip() or 'no output'}")
        xml = self._run("exec-out", "cat", self.dump_path)
        if "<hierarchy" not in xml:
            raise AdbError(f"{self.dump_path} is not a UI dump: {xml[:200].strip()!r}")
        return xml

    def tap(self, x: int, y: int) -> None:
        self._run("shell", "input", "tap", str(int(x)), str(int(y)))

    def swipe(self, x1: int, y1: int, x2: int, y2: int, duration_ms: int = 300) -> None:
        self._run("shell", "input", "swipe", *(str(int(v)) for v in (x1, y1, x2, y2, duration_ms)))

    def type_text(self, text: str) -> None:
        self._run("shell", "input", "text", escape_input_text(text))

    def press_key(self, key: int | str) -> None:
        self._run("shell", "input", "keyevent", str(android.keycode(key)))

    def open_app(self, name: str) -> None:
        """A known app name ('Settings'), a package, or an 'package/activity' component."""
        if "/" in name:
            out = self._run("shell", "am", "start", "-n", name)
            if "Error" in out:
                raise AdbError(f"am start {name} failed: {out.strip()}")
            return
        pkg = android.resolve_package(name, self.apps)
        if pkg is None:
            raise ValueError(f"unknown app {name!r}; give a package name or one of: "
                             f"{', '.join(sorted({**android.APPS, **self.apps}))}")
        out = self._run("shell", "monkey", "-p", pkg, "-c", "android.intent.category.LAUNCHER", "1")
        if "No activities found" in out or "monkey aborted" in out:
            raise ValueError(f"app {name!r} ({pkg}) is not installed or has no launcher activity")
