"""The layering of lab/ (docs/ARCHITECTURE.md) and its two rules: vLLM's private structure is read only in
lab.vllm_internals, and engines are configured only in lab.engine_settings."""

import ast
import io
import json
import re
import tokenize
from pathlib import Path

import pytest

from lab import PROJECT_ROOT

LAYERS = [
    {"backend", "model", "article"},
    {"block_hash", "prefix_cache", "radix_cache", "mini_engine", "fleet_sim"},
    {"engine_settings", "vllm_internals", "engine", "server", "fleet"},
    {"workloads", "measure", "results", "plots", "report", "runner", "bench", "capacity", "serving_bench", "routing",
     "audit", "audit_report", "notebook_server", "workshop"},
]
LAB = PROJECT_ROOT / "lab"
MODULES = sorted(p.stem for p in LAB.glob("*.py") if p.stem != "__init__")
PRIVATE_VLLM = re.compile(r"\.llm_engine\b|\bvllm\.v1\b|engine_core|kv_cache_manager|_finalizer|cache_config")


def layer(module: str) -> int:
    return next(i for i, names in enumerate(LAYERS) if module in names)


def lab_imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("lab"):
            names |= {node.module.removeprefix("lab.")} if node.module != "lab" else {a.name for a in node.names}
        elif isinstance(node, ast.Import):
            names |= {a.name.removeprefix("lab.") for a in node.names if a.name.startswith("lab.")}
    return {n for n in names if n in MODULES}


def test_every_module_has_a_layer():
    assert [m for m in MODULES if not any(m in names for names in LAYERS)] == []


@pytest.mark.parametrize("module", MODULES)
def test_a_module_imports_only_from_its_layer_or_those_before(module):
    upward = {name for name in lab_imports(LAB / f"{module}.py") if layer(name) > layer(module)}
    assert not upward, f"lab.{module} (layer {layer(module)}) imports from a later layer: {upward}"


def code_only(source: str) -> str:
    """The source without comments and strings (docs may name vLLM's modules; code may not use them)."""
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    return " ".join(t.string for t in tokens if t.type not in (tokenize.COMMENT, tokenize.STRING)).replace(" . ", ".")


def sources_outside_the_adapter():
    for path in sorted(LAB.glob("*.py")):
        if path.stem != "vllm_internals":
            yield f"lab/{path.name}", code_only(path.read_text())
    for path in sorted((PROJECT_ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        yield f"notebooks/{path.name}", "\n".join(code_only("".join(c["source"])) for c in cells if c["cell_type"] == "code")


SOURCES = dict(sources_outside_the_adapter())


@pytest.mark.parametrize("name", SOURCES)
def test_only_the_adapter_reads_vllms_private_structure(name):
    source = SOURCES[name]
    found = sorted(set(PRIVATE_VLLM.findall(source)))
    assert not found, f"{name} reaches into vLLM ({found}); add a function to lab/vllm_internals.py instead"


def test_nothing_points_outside_the_repository():
    tracked = [p for p in PROJECT_ROOT.rglob("*") if p.is_file() and p.suffix in {".py", ".md", ".ipynb", ".toml", ".yaml", ".txt"}
               and not any(part in {".venv", "runs", "models", ".git"} for part in p.relative_to(PROJECT_ROOT).parts)]
    outside = [str(p.relative_to(PROJECT_ROOT)) for p in tracked
               if re.search(r"\.\./shared|DESIGN\.md", p.read_text(errors="replace"))]
    assert outside == []
