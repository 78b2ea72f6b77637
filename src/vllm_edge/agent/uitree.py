"""uiautomator XML -> a compact indexed element list for the prompt, and index -> tap point.

Only elements an agent can act on or read are kept: clickable, checkable, or carrying text or a
content description. Labels and switches inside a clickable row are folded into that row, the
way a person reads a settings entry ("Wi-Fi", "Connected", switch on) as one thing to tap.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

from vllm_edge.common.errors import EdgeError

_BOUNDS = re.compile(r"\[(-?\d+),(-?\d+)\]\[(-?\d+),(-?\d+)\]")


class UiParseError(EdgeError, ValueError):
    """A screen dump that is not a uiautomator hierarchy."""


@dataclass
class Element:
    index: int
    cls: str  # short class name, e.g. "Switch"
    text: str
    desc: str
    bounds: tuple[int, int, int, int]
    clickable: bool
    checkable: bool = False
    checked: bool = False
    enabled: bool = True
    focused: bool = False
    selected: bool = False
    resource_id: str = ""
    package: str = ""
    parts: list[str] = field(default_factory=list)  # texts folded in from descendants

    @property
    def center(self) -> tuple[int, int]:
        x1, y1, x2, y2 = self.bounds
        return (x1 + x2) // 2, (y1 + y2) // 2

    @property
    def label(self) -> str:
        """The name a person would use for it: text, else description, else the row's first text."""
        if self.text:
            return self.text
        if self.desc:
            return self.desc
        return self.parts[0] if self.parts else ""

    @property
    def detail(self) -> str:
        seen = {self.label, self.text, self.desc}
        return "; ".join(p for p in self.parts if p not in seen)

    def describe(self) -> str:
        s = f"[{self.index}] {self.cls} "
        if self.text or self.cls == "EditText":
            s += _quote(self.text)
            if self.desc and self.desc != self.text:
                s += f" desc={_quote(self.desc)}"
        elif self.label:
            s += _quote(self.label)
        elif self.resource_id:
            s += "id=" + self.resource_id.rsplit("/", 1)[-1]
        else:
            s += '""'
        if self.detail:
            s += f" — {self.detail}"
        flags = []
        if self.checkable:
            flags.append("on" if self.checked else "off")
        if self.selected:
            flags.append("selected")
        if self.focused:
            flags.append("focused")
        if not self.enabled:
            flags.append("disabled")
        return s + "".join(f" [{f}]" for f in flags)


def _quote(s: str) -> str:
    return '"' + s.replace("\n", " ").replace('"', "'") + '"'


@dataclass
class UiTree:
    elements: list[Element]
    package: str
    scrollable: bool

    def text(self) -> str:
        lines = [f"App: {self.package or 'unknown'}"]
        lines += [e.describe() for e in self.elements] or ["(no elements on screen)"]
        if self.scrollable:
            lines.append("(This screen scrolls: swipe up to see more below, swipe down to go back up.)")
        return "\n".join(lines)

    def __len__(self) -> int:
        return len(self.elements)

    def tap_point(self, index: int) -> tuple[int, int]:
        return tap_point(self.elements, index)


def tap_point(elements: list[Element], index: int) -> tuple[int, int]:
    """Centre of the element's bounds: where a finger tap lands on it."""
    if isinstance(index, bool) or not isinstance(index, int):
        raise IndexError(f"element index must be an integer, got {index!r}")
    if not 0 <= index < len(elements):
        hi = len(elements) - 1
        raise IndexError(f"no element [{index}] on this screen; valid indices are 0-{hi}" if hi >= 0
                         else "there are no elements on this screen")
    return elements[index].center


def _attr_bool(node: ET.Element, name: str) -> bool:
    return node.get(name, "false") == "true"


def _bounds(node: ET.Element) -> tuple[int, int, int, int] | None:
    m = _BOUNDS.fullmatch(node.get("bounds", "").strip())
    if not m:
        return None
    return tuple(int(g) for g in m.groups())  # type: ignore[return-value]


def _xml_body(xml: str) -> str:
    """Cut off anything a shell wrapped around the dump (banners, 'UI hierchary dumped to')."""
    start = xml.find("<?xml")
    if start < 0:
        start = xml.find("<hierarchy")
    end = xml.rfind("</hierarchy>")
    if start < 0 or end < 0:
        raise UiParseError("not a uiautomator dump: no <hierarchy> element")
    return xml[start:end + len("</hierarchy>")]


def parse(xml: str) -> UiTree:
    try:
        root = ET.fromstring(_xml_body(xml))
    except ET.ParseError as exc:
        raise UiParseError(f"malformed uiautomator XML: {exc}") from exc
    if root.tag != "hierarchy":
        raise UiParseError(f"root element is <{root.tag}>, expected <hierarchy>")
    elements: list[Element] = []
    scrollable = False
    package = ""

    def visit(node: ET.Element, owner: Element | None) -> None:
        nonlocal scrollable, package
        b = _bounds(node)
        if b is None or b[2] <= b[0] or b[3] <= b[1]:
            return  # invisible: nothing inside can be seen or tapped
        if not package:
            package = node.get("package", "")
        scrollable = scrollable or _attr_bool(node, "scrollable")
        text = (node.get("text") or "").strip()
        desc = (node.get("content-desc") or "").strip()
        clickable = _attr_bool(node, "clickable")
        checkable = _attr_bool(node, "checkable")
        cls = (node.get("class") or "View").rsplit(".", 1)[-1]
        if clickable or ((text or desc or checkable) and owner is None):
            el = Element(
                index=len(elements), cls=cls, text=text, desc=desc, bounds=b, clickable=clickable,
                checkable=checkable, checked=_attr_bool(node, "checked"), enabled=node.get("enabled", "true") == "true",
                focused=_attr_bool(node, "focused"), selected=_attr_bool(node, "selected"),
                resource_id=node.get("resource-id", ""), package=node.get("package", ""),
            )
            elements.append(el)
            child_owner = el if clickable else None
        else:
            if owner is not None:  # fold a row's title, summary and switch into the row
                for t in (text, desc):
                    if t and t not in owner.parts:
                        owner.parts.append(t)
                if checkable and not owner.checkable:
                    owner.checkable, owner.checked, owner.cls = True, _attr_bool(node, "checked"), cls
            child_owner = owner
        for child in node:
            if child.tag == "node":
                visit(child, child_owner)

    for top in root:
        if top.tag == "node":
            visit(top, None)
    return UiTree(elements, package, scrollable)
