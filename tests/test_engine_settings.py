"""lab.serving.engine_settings: one description of the engine, rendered for vllm.LLM and for the server, parsed back
by vLLM's own code so that the two engines cannot drift apart."""

import dataclasses
import os
import subprocess
import sys

import pytest

from lab.serving import vllm_internals
from lab.serving.backend import backend
from lab.serving.engine_settings import engine_settings

CASES = {
    "defaults": {},
    "caching off, block 64": {"enable_prefix_caching": False, "block_size": 64},
    "small pool, short context, other seed": {"num_gpu_blocks_override": 41, "max_model_len": 1024, "seed": 3},
    "eager off, stats off": {"enforce_eager": False, "disable_log_stats": True},
}


def changed_fields(engine_args, baseline) -> dict:
    return {f.name: getattr(engine_args, f.name) for f in dataclasses.fields(engine_args)
            if getattr(engine_args, f.name) != getattr(baseline, f.name)}


@pytest.mark.parametrize("overrides", CASES.values(), ids=CASES.keys())
def test_llm_kwargs_and_server_flags_build_the_same_engine(overrides):
    settings = engine_settings(None, **overrides)
    served = vllm_internals.server_engine_args(["--model", settings.model, *settings.server_args()])
    in_process = vllm_internals.llm_engine_args(settings.llm_kwargs())
    served_changes = changed_fields(served, vllm_internals.server_engine_args(["--model", settings.model]))
    in_process_changes = changed_fields(in_process, vllm_internals.llm_engine_args({"model": settings.model}))
    assert served_changes == in_process_changes
    for name, value in overrides.items():
        assert getattr(served, name) == value, f"{name} reaches the server"


def test_the_lab_defaults_follow_backend_and_model():
    kwargs = engine_settings(None).llm_kwargs()
    assert kwargs["dtype"] == "float32", "the lab's models run in the fp32 they were built in"
    assert kwargs["enforce_eager"] == (backend() == "cpu")
    assert kwargs["seed"] == 0 and kwargs["enable_prefix_caching"] is True
    # vllm.LLM turns stats off unless told; TTFT and queue times need them on, so the setting is explicit.
    assert kwargs["disable_log_stats"] is False


def test_the_cpu_kv_size_goes_to_the_server_environment(monkeypatch):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "3")
    env = engine_settings(None).environment()
    assert env == ({"VLLM_CPU_KVCACHE_SPACE": "3"} if backend() == "cpu" else {})


def test_bad_input_is_rejected_before_anything_is_rendered(tmp_path):
    with pytest.raises(ValueError, match="block_size=0"):
        engine_settings(None, block_size=0)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        engine_settings(tmp_path / "missing")
    with pytest.raises(ValueError, match="max_model_len=-1"):
        engine_settings(None, max_model_len=-1)


@pytest.mark.slow
def test_importing_the_lab_changes_nothing_in_the_process():
    code = ("import os, warnings, numpy, pandas, plotly, torch, transformers, papermill  # their own filters\n"
            "before = dict(os.environ), list(warnings.filters)\n"
            "import lab, lab.experiments.measure, lab.experiments.plots, lab.serving.engine, lab.audit, lab.tools.runner\n"
            "print(dict(os.environ) == before[0], list(warnings.filters) == before[1])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "True"], out.stdout + out.stderr


@pytest.mark.slow
@pytest.mark.parametrize("first", ["import vllm", "import lab.experiments.workloads"])
def test_setup_configures_vllm_whatever_the_import_order(first):
    """vLLM reads these variables when an engine starts: after `lab.setup()`, whichever of vllm and lab came
    first, vLLM sees the engine core in-process and a quiet log level."""
    code = (f"{first}\nimport lab\nlab.setup()\nimport vllm, lab.experiments.measure\nfrom vllm import envs\n"
            "print(envs.VLLM_ENABLE_V1_MULTIPROCESSING, envs.VLLM_LOGGING_LEVEL)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.split() == ["False", "ERROR"], out.stdout
