"""JupyterLab for the notebooks, started the way `make lab` starts it: its own free port (or
LAB_PORT), a fresh token (or LAB_TOKEN), a health wait, and a message that says what to do when it
cannot start or no browser opens. It listens on 127.0.0.1 unless LAB_HOST says otherwise: the
container (Containerfile) sets LAB_HOST=0.0.0.0 so that a published port reaches it, and the address
printed is then the one a browser on the host opens.

    python -m lab.tools.notebook_server              # what `make lab` runs: JupyterLab on course/
    python -m lab.tools.notebook_server --host 0.0.0.0 --port 8888 --no-browser   # the container's command
    with JupyterLab(root="notebooks").start() as jl:
        jl.url("00_quickstart.ipynb")          # http://127.0.0.1:PORT/lab/tree/00_quickstart.ipynb?token=...
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import tempfile
import urllib.request
import webbrowser
from dataclasses import dataclass, field
from pathlib import Path

from lab import PROJECT_ROOT
from lab.front_end import front_end_env
from lab.serving.processes import (
    ManagedProcess,
    ServerStartError,
    executable_beside_python,
    free_port,
    port_in_use,
)
from lab.tools.runner import all_notebooks
from lab.tools.workshop import COURSE_DIR, build_course


def jupyter_executable() -> str:
    if found := executable_beside_python("jupyter"):
        return found
    raise FileNotFoundError(
        "jupyter is not installed in this environment: run `make setup` (it installs "
        "jupyterlab from the lock)"
    )


# no "receive official Jupyter news?" toast: it covers the page a learner (or a browser test) works
# in
WILDCARD_HOSTS = ("0.0.0.0", "::", "")  # listen on every interface

NO_NEWS = {
    "@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": False}
}


@dataclass
class JupyterLab:
    root: str | Path = PROJECT_ROOT / "notebooks"
    port: int | None = None  # None: a free one
    token: str = field(default_factory=lambda: secrets.token_hex(16))
    host: str = (
        "127.0.0.1"  # the address JupyterLab listens on; 0.0.0.0: every interface (in a container)
    )
    settings: dict[str, dict] = field(
        default_factory=dict
    )  # e.g. {"@jupyterlab/notebook-extension:tracker": {...}}

    def __post_init__(self) -> None:
        self.root = Path(self.root)
        if not self.root.is_dir():
            raise FileNotFoundError(f"root={str(self.root)!r} is not a folder of notebooks")
        if not self.token:
            raise ValueError(
                "JupyterLab needs a token (an empty one would let anyone who reaches the port run code)"
            )
        if self.port is not None and port_in_use(self.port, self.client_host):
            raise OSError(
                f"port {self.port} is already in use (another JupyterLab?): choose another with "
                "LAB_PORT=NNNN, or leave it unset for a free one"
            )
        self.managed: ManagedProcess | None = None
        self.settings = NO_NEWS | self.settings
        self.settings_dir = Path(tempfile.mkdtemp(prefix="jupyterlab-settings-"))
        for plugin, values in self.settings.items():
            package, name = plugin.split(":")
            path = self.settings_dir / package / f"{name}.jupyterlab-settings"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(values))

    @property
    def client_host(self) -> str:
        """The address to reach it at: a wildcard bind address is reached on the loopback (in a
        container, the host's browser reaches it through the published port, at the same address).
        """
        return "127.0.0.1" if self.host in WILDCARD_HOSTS else self.host

    @property
    def base(self) -> str:
        return f"http://{self.client_host}:{self.port}"

    def url(self, notebook: str | None = None, workspace: str | None = None) -> str:
        """The address of JupyterLab (or of `notebook` in it). With `workspace`, the notebook opens
        alone in a workspace of that name, reset: no tab that an earlier visit left open comes back.
        """
        path = f"/lab/tree/{notebook}" if notebook else "/lab"
        if workspace:
            return f"{self.base}/lab/workspaces/{workspace}{path.removeprefix('/lab')}?token={self.token}&reset"
        return f"{self.base}{path}?token={self.token}"

    def command(self) -> list[str]:
        allow_root = ["--allow-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []
        return [
            jupyter_executable(),
            "lab",
            str(self.root),
            f"--ServerApp.ip={self.host}",
            f"--ServerApp.port={self.port}",
            "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={self.token}",
            "--ServerApp.open_browser=False",
            "--LabApp.news_url=",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
            *allow_root,
            f"--LabApp.user_settings_dir={self.settings_dir}",
        ]

    @property
    def process(self):
        return self.managed.process if self.managed else None

    @property
    def log_path(self):
        return self.managed.log_path if self.managed else None

    def kernels(self) -> list[dict]:
        """The running kernels, each with its `execution_state` ('starting', 'idle', 'busy')."""
        with urllib.request.urlopen(
            f"{self.base}/api/kernels?token={self.token}", timeout=10
        ) as response:
            return json.loads(response.read())

    def start(self, timeout_s: float = 120.0) -> JupyterLab:
        self.port = self.port or free_port(self.host)
        self.managed = ManagedProcess(
            "JupyterLab",
            self.command(),
            f"{self.base}/api/status?token={self.token}",
            env=front_end_env(),
            log_prefix="jupyterlab-",
        )
        self.managed.start(timeout_s)
        return self

    def stop(self) -> None:
        if self.managed:
            self.managed.stop(timeout_s=15)

    def __enter__(self) -> JupyterLab:
        return self if self.process else self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lab.tools.notebook_server", description="JupyterLab on course/"
    )
    parser.add_argument(
        "--port",
        type=int,
        default=int(os.environ["LAB_PORT"]) if os.environ.get("LAB_PORT") else None,
    )
    parser.add_argument(
        "--host",
        default=os.environ.get("LAB_HOST") or "127.0.0.1",
        help="the address to listen on (LAB_HOST; 0.0.0.0 in a container, so a published port reaches it)",
    )
    parser.add_argument(
        "--token",
        default=os.environ.get("LAB_TOKEN") or None,
        help="the login token (LAB_TOKEN); a fresh random one when unset",
    )
    parser.add_argument(
        "--no-browser", action="store_true", help="print the address instead of opening a browser"
    )
    args = parser.parse_args(argv)
    COURSE_DIR.mkdir(exist_ok=True)
    try:
        token = {"token": args.token} if args.token else {}
        # a taken port is named before the copies are built
        lab = JupyterLab(root=COURSE_DIR, port=args.port, host=args.host, **token)
        print(f"your copies of the lessons, the exercises without their solutions: {COURSE_DIR}")
        lessons = all_notebooks()
        first, rest = lessons[:1], lessons[1:]
        build_course(
            notebooks=first
        )  # the first lesson, then JupyterLab opens on it while the rest are built
        lab.start()
    except (OSError, ServerStartError) as error:
        print(f"JupyterLab could not start: {error}", file=sys.stderr)
        return 1
    print(
        f"JupyterLab is running: {lab.url('00_quickstart.ipynb')}\n(stop it with Ctrl+C; its log: {lab.log_path})"
    )
    if lab.host in WILDCARD_HOSTS:
        print(
            f"it listens on every interface ({lab.host or '*'}:{lab.port}): in a container, open the address above on "
            f"the host once the port is published (docker/podman run -p {lab.port}:{lab.port} ...)"
        )
    if not args.no_browser and not webbrowser.open(lab.url("00_quickstart.ipynb")):
        print(
            "no browser could be opened on this machine: copy the address above into a browser (on a remote "
            "machine, forward the port first: ssh -L PORT:127.0.0.1:PORT host)"
        )
    try:
        if build_course(notebooks=rest, progress=True):
            print(
                "every lesson's copy is ready (refresh JupyterLab's file browser to see the new ones)"
            )
        lab.process.wait()
    except KeyboardInterrupt:
        pass
    finally:
        lab.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
