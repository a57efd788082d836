"""Named prompt sets on disk. The generators are in lab.experiments.generators; `load_workload`
generates once, saves JSONL plus a manifest (seed, count, token-length statistics under the lab
tokenizer, and a fingerprint of what produced the file) under data/workloads/, and reads the file
back on later calls while the fingerprint still matches. All text is built from the lab's own
sentences in data/corpus/.
"""

from __future__ import annotations

import hashlib
import json
import statistics
from dataclasses import dataclass
from pathlib import Path

from lab.checks import positive_int
from lab.core.model import ensure_model
from lab.core.random_model import CORPUS_DIR
from lab.experiments import generators
from lab.experiments.generators import GENERATORS, Record, num_tokens
from lab.experiments.results import write_atomically
from lab.paths import folder


def workloads_dir() -> Path:
    return folder("workloads")


@dataclass
class Workload:
    name: str
    records: list[Record]
    manifest: dict

    @property
    def prompts(self) -> list[str]:
        return [r["prompt"] for r in self.records]

    def __len__(self) -> int:
        return len(self.records)


def length_stats(lengths: list[int]) -> dict:
    return {
        "min": min(lengths),
        "median": statistics.median(lengths),
        "mean": round(statistics.fmean(lengths), 1),
        "max": max(lengths),
        "total": sum(lengths),
    }


def fingerprint() -> str:
    """SHA-256 of everything a saved workload depends on besides (name, count, seed): this module,
    the generators, the corpus, and the tokenizer that counts the tokens."""
    digest = hashlib.sha256()
    sources = [
        Path(__file__),
        Path(generators.__file__),
        *sorted(CORPUS_DIR.glob("*.txt")),
        ensure_model("tiny") / "tokenizer.json",
    ]
    for path in sources:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def make_manifest(name: str, records: list[Record], count: int, seed: int) -> dict:
    lengths = [num_tokens(r["prompt"]) for r in records]
    for record, n in zip(records, lengths):
        record["prompt_tokens"] = n
    return {
        "name": name,
        "seed": seed,
        "count": count,
        "records": len(records),
        "tokenizer": "lab tiny (byte-level BPE)",
        "prompt_tokens": length_stats(lengths),
        "fingerprint": fingerprint(),
    }


def _check(name: str, count: int | None) -> None:
    if name not in GENERATORS:
        raise ValueError(f"unknown workload {name!r}; choose one of {sorted(GENERATORS)}")
    if count is not None:
        positive_int("count", count)


def generate_workload(name: str, count: int | None = None, seed: int = 0) -> Workload:
    _check(name, count)
    generator = GENERATORS[name]
    count = count if count is not None else generator.__defaults__[0]
    records = generator(count=count, seed=seed)
    return Workload(name, records, make_manifest(name, records, count, seed))


def load_workload(name: str, count: int | None = None, seed: int = 0) -> Workload:
    """The workload from data/workloads/; generated and saved first if it is not there, or if what
    produced the saved file (generators, corpus, tokenizer) has changed since."""
    _check(name, count)
    count = count if count is not None else GENERATORS[name].__defaults__[0]
    stem = workloads_dir() / f"{name}-n{count}-seed{seed}"
    jsonl, manifest_path = stem.with_suffix(".jsonl"), stem.with_suffix(".manifest.json")
    if jsonl.is_file() and manifest_path.is_file():
        manifest = json.loads(manifest_path.read_text())
        if manifest.get("fingerprint") == fingerprint():
            records = [json.loads(line) for line in jsonl.read_text(encoding="utf-8").splitlines()]
            return Workload(name, records, manifest)
    workload = generate_workload(name, count, seed)
    # The content is a pure function of (name, count, seed) and the fingerprint, so replacing a
    # stale file is safe.
    write_atomically(
        jsonl,
        "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in workload.records),
        overwrite=True,
    )
    write_atomically(manifest_path, json.dumps(workload.manifest, indent=2) + "\n", overwrite=True)
    return workload
