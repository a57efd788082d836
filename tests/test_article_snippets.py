"""The article's commands and snippets, run against the vLLM this lab installs: what each one does here."""

import importlib.util

import pytest

from lab.core.model import ensure_model
from lab.experiments.a100 import a100_projection
from lab.serving import vllm_internals


def test_enforce_eager_false_is_not_a_value_vllms_parser_takes():
    """The article's `--enforce-eager False`: the flag takes no value, so 'False' is an unrecognised argument."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    with pytest.raises(SystemExit) as rejected:
        parser.parse_args(["--model", "m", "--enforce-eager", "False"])
    assert rejected.value.code == 2
    assert parser.parse_args(["--model", "m", "--no-enforce-eager"]).enforce_eager is False
    assert parser.parse_args(["--model", "m"]).enforce_eager is False, "graphs on is already the default"


def test_vllm_picks_256_sequences_on_an_a100():
    """The article's --max-num-seqs 256 is what vLLM's own default-picking code returns for an A100 80GB."""
    a100 = vllm_internals.gpu_batch_defaults("NVIDIA A100-SXM4-80GB", 80)
    assert a100["LLM_CLASS"]["max_num_seqs"] == a100["OPENAI_API_SERVER"]["max_num_seqs"] == 256
    batch = a100["OPENAI_API_SERVER"]["max_num_seqs"]
    one, two = (a100_projection([100] * n, [0] * n, [8] * n)["decode_s"] for n in (batch, batch + 1))
    assert two == 2 * one, "the A100 projection decodes vLLM's own batch limit per step, and one request more in two"
    h100 = vllm_internals.gpu_batch_defaults("NVIDIA H100 80GB HBM3", 80)
    assert h100["LLM_CLASS"]["max_num_seqs"] > 256, "the name matters: an H100 of the same memory gets more"


def test_the_articles_server_module_is_not_in_this_vllm():
    assert importlib.util.find_spec("vllm.entrypoints.api_server") is None
    assert importlib.util.find_spec("vllm.entrypoints.openai.api_server") is not None


def test_engine_args_alone_start_nothing():
    """The article's 5.2 snippet builds `EngineArgs(...)` and stops: a set of arguments, no engine, no model loaded."""
    import psutil

    children = set(psutil.Process().children(recursive=True))
    args = vllm_internals.llm_engine_args({"model": str(ensure_model("tiny")), "dtype": "bfloat16",
                                           "enable_prefix_caching": True})
    assert args.dtype == "bfloat16" and args.enable_prefix_caching is True
    assert not hasattr(args, "generate"), "nothing to send a prompt to"
    assert set(psutil.Process().children(recursive=True)) == children, "no engine process started"
