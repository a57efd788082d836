"""The mini-engine on a GPU keeps the contract it keeps on the CPU: against transformers on the same device, its
first logits agree with no, partial and full hits, and caching changes no greedy output. A GPU-only extra:
skipped where CUDA finds no GPU (CI), run on a lent GPU machine (docs/TESTING.md records where and when)."""

import pytest
import torch

from lab.core.mini_engine import MiniEngine
from lab.core.model import ensure_model

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
TOLERANCE = 1e-3  # float32 on the GPU, TF32 off: kernels differ from transformers' in their order of sums


@pytest.fixture(scope="module")
def tiny():
    from transformers import LlamaForCausalLM

    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    path = ensure_model("tiny")
    return path, LlamaForCausalLM.from_pretrained(path, dtype=torch.float32).eval().to("cuda")


def last_logits(hf_model, token_ids) -> torch.Tensor:
    with torch.no_grad():
        return hf_model(torch.tensor([token_ids], device="cuda")).logits[0, -1]


@pytest.mark.parametrize("block_size", [16, 128])
def test_logits_match_transformers_on_the_gpu_with_no_partial_and_full_hits(tiny, block_size):
    path, hf_model = tiny
    prompt = torch.randint(3, 2300, (1500,), generator=torch.Generator().manual_seed(0)).tolist()
    engine = MiniEngine(path, block_size=block_size, num_blocks=256, device="cuda")
    cases = [("no hit", prompt[:1200], 0), ("partial hit", prompt[:900] + [11, 12, 13], 900 // block_size * block_size),
             ("full hit", prompt[:1200], 1199 // block_size * block_size)]
    for name, token_ids, cached in cases:
        result = engine.generate(token_ids)
        assert result.num_cached_tokens == cached and result.first_logits.device.type == "cuda", name
        diff = (result.first_logits - last_logits(hf_model, token_ids)).abs().max().item()
        assert diff <= TOLERANCE, f"{name}: max |logit difference| {diff:.2e}"


def test_caching_changes_no_greedy_output_on_the_gpu(tiny):
    path, _ = tiny
    prompt = torch.randint(3, 2300, (700,), generator=torch.Generator().manual_seed(1)).tolist()
    cached = MiniEngine(path, block_size=16, num_blocks=256, device="cuda")
    plain = MiniEngine(path, block_size=16, num_blocks=256, device="cuda", enable_prefix_caching=False)
    cached.generate(prompt[:600])
    warm = cached.generate(prompt, max_tokens=16)
    cold = plain.generate(prompt, max_tokens=16)
    assert warm.num_cached_tokens == 592 and cold.num_cached_tokens == 0
    assert warm.output_token_ids == cold.output_token_ids
