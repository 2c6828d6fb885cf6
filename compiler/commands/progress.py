"""Progress of a long command on stderr: `validate: [#####.....] 120/651 llava-1.5_7b_...`,
rewritten in place, shown only on a terminal and only once the run has taken two seconds
(a quick run, a pipe or a test's captured stderr sees nothing).

Contract: `Progress(stream, label)` is a callable `(done, total, what)`; the caller calls it
before each item and once with `done == total` at the end, which clears the line.
"""

from __future__ import annotations

import time
from typing import TextIO

# A run shorter than this shows no progress at all.
QUIET_SECONDS = 2.0


class Progress:
    WIDTH = 30

    def __init__(self, stream: TextIO, label: str, quiet_seconds: float | None = None, always: bool = False):
        self.stream, self.label = stream, label
        self.start = time.monotonic()
        self.quiet = QUIET_SECONDS if quiet_seconds is None else quiet_seconds
        self.last = 0
        isatty = getattr(stream, "isatty", None)
        self.on = always or bool(isatty and isatty())

    def __call__(self, done: int, total: int, what: str) -> None:
        if not self.on:
            return
        if done >= total:
            if self.last:
                self.stream.write("\r" + " " * self.last + "\r")
                self.stream.flush()
                self.last = 0
            return
        if time.monotonic() - self.start < self.quiet:
            return
        filled = self.WIDTH * done // max(total, 1)
        line = f"{self.label}: [{'#' * filled}{'.' * (self.WIDTH - filled)}] {done}/{total} {what}"
        self.stream.write("\r" + line.ljust(self.last))
        self.stream.flush()
        self.last = len(line)
