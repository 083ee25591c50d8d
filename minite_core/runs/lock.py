"""The run-directory lock: one writer per run directory.

A resumable run (`minite pretrain`, `minite rl`) holds an exclusive `fcntl.flock` on `<state dir>/LOCK` for its
whole life; a second process on the same directory fails at once, naming the holder (pid, host, start time,
command line — written into the lock file by the holder). The kernel releases the lock when the holder exits,
however it exits (kill -9 included), so a stale LOCK file never blocks a rerun. POSIX only (fcntl); the harness
runs on Linux.
"""
from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import time
from pathlib import Path

LOCK = "LOCK"


class RunLocked(RuntimeError):
    """Another process writes this run directory."""


class RunLock:
    """Context manager: hold the lock of `directory` (created if needed) or raise RunLocked at once."""

    def __init__(self, directory: str | Path):
        self.path = Path(directory) / LOCK
        self._fh = None

    def __enter__(self) -> "RunLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fh = open(self.path, "a+")
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "an unknown process"
            fh.close()
            raise RunLocked(f"{self.path.parent} is in use by another run ({holder}); wait for it to finish or "
                            "stop it, or give this run another --out / --state directory") from None
        fh.seek(0)
        fh.truncate()
        fh.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                             "since": time.strftime("%Y-%m-%dT%H:%M:%S"), "argv": " ".join(sys.argv)[:200]}))
        fh.flush()
        self._fh = fh
        return self

    def __exit__(self, *exc) -> bool:
        if self._fh is not None:
            self._fh.seek(0)
            self._fh.truncate()  # the lock file stays (harmless); its holder line goes
            fcntl.flock(self._fh, fcntl.LOCK_UN)
            self._fh.close()
            self._fh = None
        return False
