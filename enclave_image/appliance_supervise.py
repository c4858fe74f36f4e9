"""Supervising the appliance's services: the guest's PID 1 has no systemd, so this is it.

Each service is a child process under its own uid, in its own process group, its output
prefixed with its name on the console. A service that exits is started again after a backoff
(1 s, doubling to 60 s; back to 1 s once it ran for a minute). One-shot jobs (the weekly
divergence run, the self-test turn) go through the same reaper and are awaited.

As PID 1 the reaper must also collect orphans: ``reap_all`` makes it ``waitpid(-1)``, so
every exit status in the machine comes through here (and no other code may wait for a
child while it runs). On a host (tests) it waits for its own children only.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

__all__ = ["BACKOFF", "Job", "Service", "Supervisor", "WeeklyTimer", "exit_text"]

#: Restart delays in seconds, the last one repeated.
BACKOFF: tuple[float, ...] = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0)
STABLE_S = 60.0  # a service that ran this long starts its backoff over

Say = Callable[[str], None]


@dataclass(frozen=True)
class Service:
    """A process to keep running: ``uid``/``gid`` None keep the supervisor's own."""

    name: str
    argv: tuple[str, ...]
    uid: int | None = None
    gid: int | None = None
    env: dict[str, str] | None = None
    cwd: Path | None = None
    umask: int = 0o077


@dataclass
class _Child:
    service: Service
    proc: subprocess.Popen[bytes]
    started: float
    keep: bool  # keep the output lines (a job's, for its caller)
    done: threading.Event = field(default_factory=threading.Event)
    status: int | None = None  # the raw wait status once reaped
    lines: list[str] = field(default_factory=list)
    pump: threading.Thread | None = None


@dataclass
class Job:
    """A finished one-shot run: its exit code (negative: the signal) and its output lines."""

    returncode: int
    lines: list[str]


def exit_text(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exit {os.WEXITSTATUS(status)}"


class Supervisor:
    """Starts services and jobs, reaps them, restarts services that die."""

    def __init__(
        self,
        say: Say,
        *,
        reap_all: bool = False,
        backoff: Sequence[float] = BACKOFF,
        stable_s: float = STABLE_S,
    ) -> None:
        self.say = say
        self.reap_all = reap_all
        self.backoff = tuple(backoff)
        self.stable_s = stable_s
        self._lock = threading.Lock()
        self._children: dict[int, _Child] = {}
        self._services: dict[str, _Child | None] = {}
        self._failures: dict[str, int] = {}
        self._restart_at: dict[str, float] = {}
        self._stopping = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.restarts: dict[str, int] = {}

    # -- spawning ---------------------------------------------------------------------------

    def _spawn(self, service: Service, *, keep: bool) -> _Child:
        proc = subprocess.Popen(
            list(service.argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            user=service.uid,
            group=service.gid,
            extra_groups=[] if service.uid is not None else None,
            umask=service.umask,
            env=service.env,
            cwd=service.cwd,
            start_new_session=True,
        )
        child = _Child(service, proc, time.monotonic(), keep)
        child.pump = threading.Thread(
            target=self._pump, args=(child,), name=f"out-{service.name}", daemon=True
        )
        with self._lock:
            self._children[proc.pid] = child
        child.pump.start()
        return child

    def _pump(self, child: _Child) -> None:
        assert child.proc.stdout is not None
        for raw in child.proc.stdout:
            line = raw.decode(errors="replace").rstrip("\n")
            if child.keep:
                child.lines.append(line)
            self.say(f"[{child.service.name}] {line}")
        child.proc.stdout.close()

    def start(self, service: Service) -> int:
        """Start ``service`` and keep it running; returns its first pid."""
        child = self._spawn(service, keep=False)
        with self._lock:
            self._services[service.name] = child
            self.restarts.setdefault(service.name, 0)
        self.say(f"supervisor: started {service.name} (pid {child.proc.pid})")
        return child.proc.pid

    def pid(self, name: str) -> int | None:
        with self._lock:
            child = self._services.get(name)
        return None if child is None or child.done.is_set() else child.proc.pid

    def run(self, job: Service, timeout: float) -> Job:
        """Run a one-shot job to its end (killed at ``timeout``); needs the reaper running."""
        child = self._spawn(job, keep=True)
        if not child.done.wait(timeout):
            self._signal(child, signal.SIGKILL)
            child.done.wait(10)
            self.say(f"supervisor: {job.name} killed after {timeout:.0f} s")
        if child.pump is not None:
            child.pump.join(5)
        status = child.status if child.status is not None else 0
        code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        return Job(code, child.lines)

    # -- reaping and restarting ----------------------------------------------------------------

    def _reaped(self) -> list[tuple[int, int]]:
        found = []
        if self.reap_all:
            while True:
                try:
                    pid, status = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    break
                if pid == 0:
                    break
                found.append((pid, status))
        else:
            with self._lock:
                pids = list(self._children)
            for pid in pids:
                try:
                    got, status = os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    continue
                if got:
                    found.append((got, status))
        return found

    def poll(self) -> None:
        """Reap what exited, note it, restart services whose backoff is over."""
        now = time.monotonic()
        for pid, status in self._reaped():
            with self._lock:
                child = self._children.pop(pid, None)
            if child is None:
                continue  # an orphan the kernel handed to PID 1
            child.status = status
            child.proc.returncode = (
                -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
            )
            child.done.set()
            name = child.service.name
            with self._lock:
                supervised = self._services.get(name) is child
            if not supervised or self._stopping:
                continue
            ran = now - child.started
            failures = 0 if ran >= self.stable_s else self._failures.get(name, 0) + 1
            self._failures[name] = failures
            delay = self.backoff[min(max(failures - 1, 0), len(self.backoff) - 1)]
            self._restart_at[name] = now + delay
            self.say(f"supervisor: {name} {exit_text(status)}; restarting in {delay:g} s")
        for name, due in list(self._restart_at.items()):
            if due <= now and not self._stopping:
                del self._restart_at[name]
                with self._lock:
                    old = self._services[name]
                assert old is not None
                child = self._spawn(old.service, keep=False)
                with self._lock:
                    self._services[name] = child
                    self.restarts[name] += 1
                self.say(f"supervisor: restarted {name} (pid {child.proc.pid})")

    def start_reaper(self, tick: float = 0.1) -> None:
        def loop() -> None:
            while not self._stop.wait(tick):
                self.poll()

        self._thread = threading.Thread(target=loop, name="reaper", daemon=True)
        self._thread.start()

    # -- stopping ----------------------------------------------------------------------------

    def _signal(self, child: _Child, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.proc.pid, sig)

    def stop_all(self, timeout: float = 15.0) -> None:
        """SIGTERM every child's process group, SIGKILL what is left after ``timeout``."""
        self._stopping = True
        with self._lock:
            children = list(self._children.values())
        for child in children:
            self._signal(child, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for child in children:
            if not child.done.wait(max(0.0, deadline - time.monotonic())):
                self.say(f"supervisor: {child.service.name} ignored SIGTERM; killing it")
                self._signal(child, signal.SIGKILL)
                child.done.wait(5)
            else:
                self.say(
                    f"supervisor: {child.service.name} stopped ({exit_text(child.status or 0)})"
                )
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        self.poll()  # whatever the reaper thread left


class WeeklyTimer:
    """A job every ``period``, its next due time kept in ``state`` (a JSON file) so that a
    reboot does not postpone it: an overdue run starts as soon as the timer does."""

    def __init__(
        self,
        state: Path,
        run: Callable[[], None],
        *,
        period: timedelta = timedelta(days=7),
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.state = state
        self.job = run
        self.period = period
        self.now = now
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def next_due(self) -> datetime:
        """When the job runs next (first call ever: one period from now, and kept)."""
        try:
            return datetime.fromisoformat(json.loads(self.state.read_text())["next"])
        except (OSError, ValueError, KeyError, TypeError):
            due = self.now() + self.period
            self._save(due)
            return due

    def _save(self, due: datetime) -> None:
        tmp = self.state.with_name(f".{self.state.name}.tmp")
        tmp.write_text(json.dumps({"next": due.isoformat(timespec="seconds")}))
        os.replace(tmp, self.state)

    def tick(self) -> bool:
        """Run the job if it is due; returns whether it ran."""
        if self.now() < self.next_due():
            return False
        self._save(self.now() + self.period)  # before the run: a crash must not loop it
        self.job()
        return True

    def start(self, check_every: float = 60.0) -> None:
        def loop() -> None:
            while True:
                self.tick()
                if self._stop.wait(check_every):
                    return

        self._thread = threading.Thread(target=loop, name="timer", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
