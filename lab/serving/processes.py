"""Processes the lab starts and must stop: a vLLM server, the router, JupyterLab.

One `ManagedProcess` launches a command as the leader of its own process group (so stopping it ends
everything it started), with its output in a log file, waits until its health URL answers (raising
with the end of the log if it exits or times out first), and stops the whole group. Linux ends the
group if this process dies without cleaning up.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path


class ServerStartError(RuntimeError):
    """The process exited or did not become healthy; the message carries the end of its log."""


class ManagedService:
    """What a server object that runs one ManagedProcess at `host`:`port` shows of it (vLLM's
    server, the router)."""

    host: str
    port: int | None
    managed: ManagedProcess

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def process(self):
        return self.managed.process

    @property
    def log_path(self):
        return self.managed.log_path


class ManagedProcess:
    """`name` (for messages) running `command`; healthy when GET `health_url` answers 200."""

    def __init__(
        self,
        name: str,
        command: Sequence[str],
        health_url: str,
        env: Mapping[str, str] | None = None,
        log_prefix: str = "lab-process-",
    ) -> None:
        self.name, self.command, self.health_url = name, list(command), health_url
        self.env = dict(os.environ if env is None else env)
        self.log_path = Path(tempfile.mkstemp(prefix=log_prefix, suffix=".log")[1])
        self.process: subprocess.Popen | None = None

    def launch(self) -> None:
        """Start the command and return at once (several can then start side by side)."""
        if self.process is not None:
            raise RuntimeError(f"{self.name} already started")
        with open(self.log_path, "a") as log:  # a restart adds to the same log
            self.process = subprocess.Popen(
                self.command,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )

    def wait_until_healthy(self, timeout_s: float) -> None:
        """Poll the health URL until it answers; raise ServerStartError with the end of the log if
        the process exits first or `timeout_s` passes."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ServerStartError(
                    f"{self.name} exited with code {self.process.returncode} during start-up; "
                    f"end of its log ({self.log_path}):\n{self.log_tail()}"
                )
            if answers(self.health_url):
                return
            time.sleep(0.3)
        raise ServerStartError(
            f"{self.name} not healthy after {timeout_s:.0f} s; end of its log ({self.log_path}):\n"
            f"{self.log_tail()}"
        )

    def start(self, timeout_s: float) -> None:
        """Launch, then wait until healthy; stop the group if it does not get there."""
        self.launch()
        try:
            self.wait_until_healthy(timeout_s)
        except BaseException:
            self.stop()
            raise

    def kill(self) -> None:
        """SIGKILL the whole process group at once, as a crash would end it (no clean shutdown)."""
        if self.running():
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10.0)

    def restart(self, timeout_s: float) -> None:
        """Stop the process if it still runs, then start the same command again and wait until
        healthy."""
        self.stop()
        self.process = None
        self.start(timeout_s)

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM the process group, SIGKILL it if it outlives `timeout_s` (idempotent)."""
        if not self.running():
            return
        group = self.process.pid
        for sig, wait in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(group, sig)
            except ProcessLookupError:
                return
            try:
                self.process.wait(wait)
            except subprocess.TimeoutExpired:
                continue
            if _group_gone(group, wait_s=5.0):  # helpers the leader started exit after it
                return

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


def _die_with_parent() -> None:
    """In the child, before exec: ask Linux to SIGTERM it if the notebook kernel dies without
    cleaning up."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _group_gone(group: int, wait_s: float) -> bool:
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def answers(url: str, timeout_s: float = 2.0) -> bool:
    """True when GET `url` answers 200."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return response.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


def executable_beside_python(name: str) -> str | None:
    """The console script `name` installed beside this Python (the lab's venv), else on PATH, else
    None."""
    beside = Path(sys.executable).with_name(name)
    return str(beside) if beside.is_file() else shutil.which(name)


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on, for a server about to start. Drawn below the kernel's ephemeral
    range: a port the kernel hands out (bind to 0) can be taken again by any process's outgoing
    connection, e.g. a router's health checks, before the server binds it ("Address already in use",
    seen with two workers)."""
    low = _ephemeral_range()[0]
    draw = (
        random.SystemRandom()
    )  # not the `random` module: notebooks seed it, and two would draw the same ports
    if low > 10_000:
        for _ in range(50):
            port = draw.randrange(10_000, low)
            if _bindable(host, port):
                return port
    with socket.socket() as s:  # no room below the range: the kernel's choice
        s.bind((host, 0))
        return s.getsockname()[1]


def _bindable(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 49152, 65535  # the IANA range, where /proc does not say (macOS, Windows)


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        return s.connect_ex((host, port)) == 0
