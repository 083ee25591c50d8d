"""A Snakemake workflow and its jobs stop together, and a killed workflow leaves nothing that blocks the next one.

Jobs. The Snakefile exports its own pid as $MINITE_WORKFLOW_PID (`export_pid`) before any job starts; every
`minite` process that finds it (minite_core/cli.py) watches that process from a daemon thread (`stop_with_workflow`:
one /proc read a second, by start time, so a reused pid does not fool it) and stops itself with SIGTERM once the
workflow is gone. A SIGKILLed snakemake therefore leaves no orphan holding a run lock, a GPU and CPU time; the job
resumes from its last checkpoint on the next run, as after any kill. (PR_SET_PDEATHSIG would watch the job's
direct parent, snakemake's `bash -c`, which outlives snakemake; a torchrun launcher's ranks each watch too.)

The next workflow. Snakemake's lock files (.snakemake/locks) and incomplete-job markers (.snakemake/incomplete)
outlive a SIGKILLed snakemake and make the next run ask for `--unlock`, then `--rerun-incomplete`. The Snakefile
calls `take_over(".snakemake")` at parse time: it takes an flock on .snakemake/minite-workflow.lock and holds it for
the life of the snakemake process (the kernel drops it however the process ends). Getting it means no snakemake of
this DAG is alive in this directory, so what the locks and markers say is stale: the locks go, and each output a
marker names (a job's partial output) is removed with its marker, so the job simply runs again — what
`--rerun-incomplete` would do. A second snakemake started while one runs does not get the flock and changes
nothing: Snakemake's own lock then refuses it as before.
"""
from __future__ import annotations

import base64
import fcntl
import os
import shutil
import signal
import threading
import time
from pathlib import Path

ENV_VAR = "MINITE_WORKFLOW_PID"
POLL_S = 1.0
_HELD: list = []  # the open flock of take_over, kept for the life of the process
_WATCHING: list[threading.Thread] = []


def export_pid() -> None:
    """Make this process (snakemake, parsing the Snakefile) the workflow its `minite` jobs watch."""
    os.environ[ENV_VAR] = str(os.getpid())


def _start_time(pid: int) -> str | None:
    """The process's start time (field 22 of /proc/<pid>/stat), None when it is gone (or a zombie)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) "
    return None if fields[0] == "Z" else fields[19]


def stop_with_workflow() -> None:
    """In a job of the workflow named by $MINITE_WORKFLOW_PID: SIGTERM this process once the workflow is gone
    (module docstring). No-op without the variable, off Linux, or when already watching."""
    pid = os.environ.get(ENV_VAR, "")
    if not pid.isdigit() or not Path("/proc/self/stat").exists() or _WATCHING:
        return
    born = _start_time(int(pid))

    def watch() -> None:
        while _start_time(int(pid)) == born and born is not None:
            time.sleep(POLL_S)
        os.kill(os.getpid(), signal.SIGTERM)

    thread = threading.Thread(target=watch, name="stop-with-workflow", daemon=True)
    _WATCHING.append(thread)
    thread.start()


def _marked_output(marker: Path, root: Path) -> Path:
    """The output path an incomplete-job marker names (Snakemake's record path: urlsafe base64 of the path, cut
    into '@'-prefixed chunks at the file-name limit)."""
    encoded = "".join(part.lstrip("@") for part in marker.relative_to(root).parts)
    return Path(base64.urlsafe_b64decode(encoded).decode())


def take_over(snakemake_dir: str | Path = ".snakemake") -> bool:
    """At parse time: if no snakemake of this DAG is alive here, clear what a killed one left (module docstring)
    and return True; else change nothing and return False."""
    root = Path(snakemake_dir)
    root.mkdir(parents=True, exist_ok=True)
    fh = open(root / "minite-workflow.lock", "a+")
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.close()
        return False
    _HELD.append(fh)
    shutil.rmtree(root / "locks", ignore_errors=True)
    incomplete = root / "incomplete"
    for marker in sorted(p for p in incomplete.rglob("*") if p.is_file() and p.name != "migration_underway"):
        try:
            output = _marked_output(marker, incomplete)
        except (ValueError, UnicodeDecodeError):
            continue  # not a marker this version writes: leave it to Snakemake
        if output.is_dir() and not output.is_symlink():
            shutil.rmtree(output)
        else:
            output.unlink(missing_ok=True)
        marker.unlink()
    return True
