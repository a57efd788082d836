"""The container image (Containerfile), checked without building it: it installs from the lock files that exist, with
hashes; it copies what the image needs and .dockerignore keeps the host's environment and run outputs out; it runs
as a user, not root; its command starts JupyterLab on every interface of the container, on the port it exposes,
with course/ in a volume; the dev container builds from it and forwards that port; the arm64 lock pins what the
x86-64 locks pin. Building it needs podman or docker and minutes of CPU: docs/TESTING.md records the build here."""

import fnmatch
import json
import re
import shlex

import pytest

from lab import PROJECT_ROOT

CONTAINERFILE = PROJECT_ROOT / "Containerfile"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Containerfile, continuation lines joined and comments dropped."""
    lines = [line for line in CONTAINERFILE.read_text().splitlines() if not line.lstrip().startswith("#")]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    found = []
    for line in joined.splitlines():
        if line.strip():
            keyword, _, rest = line.strip().partition(" ")
            found.append((keyword.upper(), " ".join(rest.split())))
    return found


def args_of(keyword: str) -> list[str]:
    return [rest for kw, rest in instructions() if kw == keyword]


def exec_form(keyword: str) -> list[str]:
    (value,) = args_of(keyword)[-1:]
    return json.loads(value)


def env() -> dict[str, str]:
    found = {}
    for rest in args_of("ENV"):
        for pair in shlex.split(rest):
            name, _, value = pair.partition("=")
            found[name] = value
    return found


def dockerignore() -> list[str]:
    return [line.strip() for line in (PROJECT_ROOT / ".dockerignore").read_text().splitlines()
            if line.strip() and not line.startswith("#")]


def ignored(path: str) -> bool:
    """Whether the build context leaves `path` out: the last .dockerignore pattern that matches it (or a folder
    above it) decides, `!` bringing it back, as Docker and Buildah read the file."""
    decision = False
    parts = path.split("/")
    for pattern in dockerignore():
        negate = pattern.startswith("!")
        pattern = pattern.removeprefix("!").strip("/")
        for depth in range(1, len(parts) + 1):
            prefix = "/".join(parts[:depth])
            if fnmatch.fnmatchcase(prefix, pattern) or (pattern.startswith("**/")
                                                        and fnmatch.fnmatchcase(prefix.split("/")[-1], pattern[3:])):
                decision = not negate
                break
    return decision


def locked(name: str) -> dict[str, str]:
    """Package -> version of a lock file, asserting that every pin carries at least one sha256."""
    text = re.sub(r"#.*", "", (PROJECT_ROOT / name).read_text()).replace("\\\n", " ")
    found = {}
    for entry in filter(None, (line.strip() for line in text.splitlines())):
        assert re.fullmatch(r"[\w.-]+==\S+( +--hash=sha256:[0-9a-f]{64})+", entry), entry[:120]
        package, version = entry.split()[0].split("==")
        found[package] = version
    return found


def test_the_base_image_is_a_build_argument_with_a_python_the_lock_installs_on():
    keywords = [kw for kw, _ in instructions()]
    assert keywords[0] == "ARG" and args_of("ARG")[0].startswith("BASE_IMAGE=")
    assert args_of("FROM") == ["${BASE_IMAGE}"], "one stage, from the base the build argument names"
    default = args_of("ARG")[0].removeprefix("BASE_IMAGE=")
    assert default.startswith("docker.io/library/python:3.11-") and "bookworm" in default, \
        "a fully qualified name (Podman asks which registry otherwise) of a Debian with CPython 3.11"
    # Debian's own python3 is 3.11.2; the lock's soupsieve asks for 3.11.5 or later, and the build says so
    assert "sys.version_info >= (3, 11, 5)" in CONTAINERFILE.read_text()


def test_it_installs_the_locks_that_exist_with_hashes_and_resolves_nothing():
    runs = " ".join(args_of("RUN"))
    named = set(re.findall(r"requirements-lock-[\w-]+\.txt", runs))
    assert named == {"requirements-lock-cpu.txt", "requirements-lock-dev.txt", "requirements-lock-cpu-arm64.txt"}
    assert all((PROJECT_ROOT / name).is_file() for name in named)
    copied_before_install = " ".join(args_of("COPY")[0].split()[1:-1])
    assert all(name in copied_before_install for name in named), "the locks are in the image before the install"
    installs = re.findall(r"\.venv/bin/pip install [^;]*", runs)
    lock_installs = [cmd for cmd in installs if "-r requirements-lock" in cmd]
    assert lock_installs and all("--no-deps" in cmd and "--require-hashes" in cmd for cmd in lock_installs)
    assert "-r requirements-lock-cpu.txt -r requirements-lock-dev.txt" in runs, "amd64: the lock `make setup` installs"
    # torch's CPU build: PyTorch's CPU index unless a build argument says otherwise
    assert "ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu" in CONTAINERFILE.read_text()
    assert all(f"ARG {name}=" in CONTAINERFILE.read_text() for name in ("PIP_FIND_LINKS", "PIP_CERT"))
    assert "pip install --no-deps --no-build-isolation -e ." in runs, "the lab installed as `make setup` does"


def test_it_builds_both_models_into_the_image():
    runs = " ".join(args_of("RUN"))
    makefile = (PROJECT_ROOT / "Makefile").read_text()
    for preset in ("tiny", "smollm2"):
        assert f"python -m lab.core.model --preset {preset}" in runs
        assert f"python -m lab.core.model --preset {preset}" in makefile, "the same command `make setup` runs"
    assert "touch .venv/.installed-cpu" in runs, "`make lab` inside the image finds the install done"


def test_the_image_holds_what_the_lab_needs_and_not_the_hosts_environment():
    assert any(rest.split()[-2:] == [".", "."] for rest in args_of("COPY")), "the project is copied whole"
    for needed in ("lab/__init__.py", "lab/tools/notebook_server.py", "notebooks/00_quickstart.ipynb", "data/corpus",
                   "pyproject.toml", "Makefile", "requirements-lock-cpu.txt", "data/workloads/README.md"):
        assert (PROJECT_ROOT / needed).exists(), needed
        assert not ignored(needed), f"{needed} is needed in the image but .dockerignore leaves it out"
    for host_only in (".venv", ".venv/bin/python", "models", "models/tiny-seed0/config.json", "runs", "course",
                      "data/results", "data/workloads/chat-n12-seed0.jsonl", ".git", "lab/__pycache__/x.pyc", ".cache"):
        assert ignored(host_only), f"{host_only} must stay out of the build context"


def test_it_runs_as_a_user_and_starts_jupyterlab_on_every_interface_with_the_course_in_a_volume():
    users = args_of("USER")
    assert users and users[-1] not in ("root", "0"), "the lab runs as a user"
    keywords = [kw for kw, _ in instructions()]
    assert keywords.index("USER") < keywords.index("CMD")
    command = exec_form("CMD")
    assert command[:3] == ["python", "-m", "lab.tools.notebook_server"], "what `make lab` runs"
    assert command[command.index("--host") + 1] == "0.0.0.0" and "--no-browser" in command
    port = command[command.index("--port") + 1]
    assert args_of("EXPOSE") == [port] and env()["LAB_PORT"] == port and env()["LAB_HOST"] == "0.0.0.0"
    assert json.loads(args_of("VOLUME")[0]) == ["/opt/lab/course"]
    assert args_of("WORKDIR")[-1] == "/opt/lab", "the project root, so course/ is /opt/lab/course"
    assert exec_form("ENTRYPOINT")[0].endswith("tini"), "a PID 1 that passes Ctrl+C and `docker stop` on"


def test_the_dev_container_builds_from_the_containerfile_and_forwards_its_port():
    folder = PROJECT_ROOT / ".devcontainer"
    text = (folder / "devcontainer.json").read_text()
    config = json.loads("\n".join(line for line in text.splitlines() if not line.lstrip().startswith("//")))
    assert (folder / config["build"]["dockerfile"]).resolve() == CONTAINERFILE
    assert (folder / config["build"]["context"]).resolve() == PROJECT_ROOT
    port = int(exec_form("CMD")[exec_form("CMD").index("--port") + 1])
    assert port in config["forwardPorts"] and str(port) in config["portsAttributes"]
    assert config["remoteUser"] == args_of("USER")[-1]
    memory = int(config["hostRequirements"]["memory"].removesuffix("gb"))
    assert memory >= 8, "the course's measured need (WORKSHOP.md) fits"


def test_the_arm64_lock_pins_the_x86_64_locks_versions():
    x86 = locked("requirements-lock-cpu.txt") | locked("requirements-lock-dev.txt")
    arm = locked("requirements-lock-cpu-arm64.txt")
    x86_only = {"intel-openmp", "intel-cmplr-lib-ur", "triton"}
    assert set(x86) - set(arm) == x86_only | {"torch"}, "torch: from PyTorch's index at build time (the lock's header)"
    assert not set(arm) - set(x86)
    assert all(arm[name] == x86[name] for name in arm), "the same versions on both architectures"
    assert "torch==2.13.0+cpu" in CONTAINERFILE.read_text()


def test_make_image_builds_with_the_containerfile():
    makefile = (PROJECT_ROOT / "Makefile").read_text()
    target = re.search(r"^image:.*?(?=^\S|\Z)", makefile, re.S | re.M)
    assert target and "-f Containerfile" in target.group(0)


def test_jupyterlab_listens_where_it_is_told_and_names_the_address_a_browser_opens(monkeypatch):
    from lab.tools import notebook_server
    from lab.tools.notebook_server import JupyterLab

    lab = JupyterLab(host="0.0.0.0", token="t" * 32)
    lab.port = 8888
    assert "--ServerApp.ip=0.0.0.0" in lab.command()
    assert lab.url("00_quickstart.ipynb") == f"http://127.0.0.1:8888/lab/tree/00_quickstart.ipynb?token={'t' * 32}"
    with pytest.raises(ValueError, match="needs a token"):
        JupyterLab(token="")

    seen = {}

    class Refused(JupyterLab):
        def __init__(self, **kwargs):
            seen.update(kwargs)
            raise OSError("stop here")

    monkeypatch.setattr(notebook_server, "JupyterLab", Refused)
    monkeypatch.setenv("LAB_HOST", "0.0.0.0")
    monkeypatch.setenv("LAB_TOKEN", "s" * 32)
    assert notebook_server.main(["--port", "8888", "--no-browser"]) == 1
    assert seen["host"] == "0.0.0.0" and seen["token"] == "s" * 32 and seen["port"] == 8888
    monkeypatch.delenv("LAB_HOST")
    monkeypatch.delenv("LAB_TOKEN")
    seen.clear()
    notebook_server.main(["--no-browser"])
    assert seen["host"] == "127.0.0.1" and "token" not in seen, "`make lab`: the loopback, a fresh token"
