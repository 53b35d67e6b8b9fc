"""Child processes of the launcher: started in process groups of their own, watched, lowered in
priority and signalled as a whole. Linux only (process groups are read from /proc).

In:  a command line, a log file, an environment; process group ids; a URL to poll.
Out: ``spawn`` -> a ``Popen`` leading its own session and group, logging to the file (the
     parent-death signal when ``attach``, a lower CPU priority when ``nice`` > 0);
     ``group_members`` -> the live processes of a group; ``healthy`` -> whether a URL answers 200;
     ``log_tail`` -> the last lines of a log; ``signal_group`` -> a signal to a whole group;
     ``lower_priority``/``lower_session_priority`` -> a running process's CPU priority lowered.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path

from fleet.errors import LaunchError

__all__ = [
    "LOG_TAIL_LINES",
    "child_setup",
    "group_members",
    "healthy",
    "log_tail",
    "lower_priority",
    "lower_session_priority",
    "signal_group",
    "spawn",
]

LOG_TAIL_LINES = 40


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes in process group ``pgid``."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read().decode("utf-8", "replace")
        except OSError:
            continue
        # fields after the command name (which may contain spaces) in parentheses
        rest = stat.rsplit(")", 1)[-1].split()
        if len(rest) > 2 and rest[0] != "Z" and int(rest[2]) == pgid:
            members.append(int(entry))
    return members


def healthy(url: str, timeout: float = 2.0) -> bool:
    """Whether ``url`` (a base: its ``/health``; a path given: that URL) answers 200."""
    full = url if urllib.parse.urlsplit(url).path not in ("", "/") else f"{url.rstrip('/')}/health"
    try:
        with urllib.request.urlopen(full, timeout=timeout) as response:
            status: int = response.status
            return status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def _set_parent_death_signal() -> None:  # runs in the child between fork and exec
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def child_setup(attach: bool, nice: int) -> Callable[[], None] | None:
    """What a child runs between fork and exec: the parent-death signal (``attach``) and a lower
    CPU priority (``nice`` > 0)."""
    if not attach and nice <= 0:
        return None

    def setup() -> None:
        if attach:
            _set_parent_death_signal()
        if nice > 0:
            with contextlib.suppress(OSError):  # a priority we may not lower: run as is
                os.nice(nice)

    return setup


def spawn(
    cmd: list[str], log_path: Path, what: str, attach: bool, *, nice: int = 0, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """A child in its own session and process group, logging to ``log_path`` (appended, after a
    line naming ``what``); ``env`` is added to this process's environment."""
    with open(log_path, "ab") as log:
        log.write(f"\n==== fleetscope: starting {what} at {time.ctime()}\n".encode())
        log.flush()
        return subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **env} if env else None,
            start_new_session=True,
            preexec_fn=child_setup(attach, nice),  # noqa: PLW1509
        )


def lower_priority(pid: int, nice: int) -> bool:
    """``pid`` and the session it leads at CPU priority ``nice`` (``lower_session_priority``)."""
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, pid, nice)
    return lower_session_priority(pid, nice)


def lower_session_priority(pid: int, nice: int, tries: int = 10) -> bool:
    """Give the session ``pid`` leads the CPU priority ``nice`` (Linux autogroups); True when set.

    A child started with ``start_new_session`` leads a session of its own, and Linux's autogroup
    scheduler shares the CPU between sessions before it reads a process's nice: a niced process
    in its own session gets as much as any other session (measured: three engines at nice 10
    left `up` 13 % of a core). The session's own nice is what ranks it against the others. The
    kernel lets an unprivileged user set one such nice per 100 ms (EAGAIN before): engines
    started back to back wait their turn. False where there are no autogroups (the process's
    nice is then all there is) or the kernel refuses."""
    path = f"/proc/{pid}/autogroup"
    for _ in range(tries):
        try:
            with open(path, "w") as f:
                f.write(str(nice))
            return True
        except BlockingIOError:  # EAGAIN: another session's nice was set less than 100 ms ago
            time.sleep(0.11)
        except OSError:
            return False
    return False


def signal_group(pgid: int, sig: signal.Signals) -> None:
    """``sig`` to every process of group ``pgid`` (one already gone is no error)."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass
    except PermissionError as exc:
        raise LaunchError(f"cannot signal process group {pgid}: {exc}") from None
