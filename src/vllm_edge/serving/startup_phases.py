"""What a starting server is doing, read from its log: the phases of a first start (converting,
quantizing, building the native op, loading, compiling, the KV cache) with their progress, so
`run` can show them while it waits instead of one silent line.

The server writes everything to its log (its own lines, vLLM's, the builders' progress bars);
:class:`PhaseTracker` reads what is new on each poll, knows the phases by the lines that open
them, and keeps the latest progress fragment (a tqdm bar's counter) of the current phase.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path

# (label, the line that opens the phase), in the order a first start meets them
PHASES: tuple[tuple[str, re.Pattern], ...] = tuple((label, re.compile(pattern)) for label, pattern in (
    ("converting the model to bf16", r"^import \S+\.gguf|Converting and de-quantizing"),
    ("repacking the GGUF's codes", r"^repack \S+"),
    ("quantizing", r"^quantize \S+ g\d+"),
    ("starting the engine", r"Initializing a V1 LLM engine"),
    ("loading the weights", r"Starting to load model"),
    ("building the native op (once per machine)", r": building it once for this torch and CPU"),
    ("compiling the model (cached for the next start)", r"Warming up model for the compilation"),
    ("allocating the KV cache", r"CPU KV cache size"),
    ("starting the API server", r"Starting vLLM server on"),
))
# the server's own lines that `run` passes on as they come (what this start does differently)
NOTE = re.compile(r"^\[vllm-edge\] (compiled graph: not cached yet.*)$")
# a progress bar's counter: "45%|####      | 123/273 [00:12<00:13, 9.81tensor/s]"
PROGRESS = re.compile(r"(\d+%)\|[^|]*\|\s*(\d+/\d+)")


@dataclass
class Update:
    """What changed since the last poll: phases that ended (label, seconds), the current phase
    and its latest progress counter."""
    ended: list[tuple[str, float]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    current: str | None = None
    progress: str = ""
    elapsed_s: float = 0.0


class PhaseTracker:
    def __init__(self, log: Path, clock=time.monotonic) -> None:
        self.log = Path(log)
        self.clock = clock
        self.offset = 0
        self.partial = ""
        self.index = -1  # the current phase's position in PHASES
        self.since = clock()
        self.progress = ""

    def poll(self) -> Update:
        """Read what the log gained and return the phases that moved."""
        update = Update()
        try:
            with open(self.log, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            data = b""
        self.offset += len(data)
        text = self.partial + data.decode(errors="replace")
        pieces = re.split(r"[\r\n]", text)
        self.partial = pieces.pop()  # an unfinished line waits for the next poll
        update.notes = [m.group(1) for m in map(NOTE.match, pieces) if m]  # whole lines only
        for piece in pieces + ([self.partial] if PROGRESS.search(self.partial) else []):
            for i in range(self.index + 1, len(PHASES)):
                if PHASES[i][1].search(piece):
                    now = self.clock()
                    if 0 <= self.index < len(PHASES):
                        update.ended.append((PHASES[self.index][0], now - self.since))
                    self.index, self.since, self.progress = i, now, ""
                    break
            m = PROGRESS.search(piece)
            if m and self.index >= 0:
                self.progress = f"{m.group(1)} {m.group(2)}"
        update.current = PHASES[self.index][0] if 0 <= self.index < len(PHASES) else None
        update.progress = self.progress
        update.elapsed_s = self.clock() - self.since
        return update

    def finish(self) -> Update:
        """The server is ready: the last phase ends now."""
        update = self.poll()
        if 0 <= self.index < len(PHASES):
            update.ended.append((PHASES[self.index][0], self.clock() - self.since))
            self.index = len(PHASES)
        update.current = None
        return update


class Display:
    """Shows the updates on a terminal: each finished phase on its own line with its time, the
    current one on a line redrawn in place with its progress. Off a terminal, finished phases only."""

    def __init__(self, stream, tty: bool, prefix: str = "[vllm-edge] ") -> None:
        self.stream, self.tty, self.prefix = stream, tty, prefix
        self.live = False

    def __call__(self, update: Update) -> None:
        for label, seconds in update.ended:
            self._clear()
            self.stream.write(f"{self.prefix}{label}: {seconds:.0f} s\n")
        for note in update.notes:
            self._clear()
            self.stream.write(f"{self.prefix}{note}\n")
        if self.tty and update.current:
            detail = f" {update.progress}" if update.progress else ""
            self.stream.write(f"\r\033[K{self.prefix}{update.current}...{detail} {update.elapsed_s:.0f} s")
            self.live = True
        self.stream.flush()

    def _clear(self) -> None:
        if self.live:
            self.stream.write("\r\033[K")
            self.live = False
