"""The real OpenAI client against a lab server or router: one streamed completion with TTFT as the client sees
it and the usage the server reports, and many at once on a thread pool."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from lab.checks import positive_int


def openai_client(base_url: str):
    """The real OpenAI client for a lab server or router (no retries: a failure shows as it happened)."""
    from openai import OpenAI

    return OpenAI(base_url=base_url, api_key="not-needed", max_retries=0, timeout=600)


@dataclass
class StreamResult:
    ttft_s: float  # client side: request sent to first streamed token
    e2e_s: float
    text: str
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int


def stream_completion(client, model: str, prompt: str, max_tokens: int = 8, headers: Mapping[str, str] | None = None,
                      **extra_body) -> StreamResult:
    """One streamed completion; TTFT as the client sees it, and the usage the server reports. `headers` are
    sent with the request (e.g. a session key for a router)."""
    start = time.perf_counter()
    stream = client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, temperature=0.0,
                                       stream=True, stream_options={"include_usage": True},
                                       extra_headers=headers, extra_body=extra_body or None)
    first, text, usage = None, [], None
    for chunk in stream:
        if chunk.choices:  # a token arrived (its text may be empty until a UTF-8 character completes)
            first = first or time.perf_counter()
            text.append(chunk.choices[0].text or "")
        if chunk.usage is not None:
            usage = chunk.usage
    end = time.perf_counter()
    details = getattr(usage, "prompt_tokens_details", None)
    return StreamResult(ttft_s=(first or end) - start, e2e_s=end - start, text="".join(text),
                        prompt_tokens=usage.prompt_tokens if usage else 0,
                        cached_tokens=(details.cached_tokens or 0) if details else 0,
                        completion_tokens=usage.completion_tokens if usage else 0)


def complete_concurrently(client, model: str, prompts: Sequence[str], *, concurrency: int, max_tokens: int = 8,
                          progress: bool = True, return_exceptions: bool = False,
                          headers: Sequence[Mapping[str, str] | None] | None = None) -> list[StreamResult | Exception]:
    """Stream every prompt with at most `concurrency` requests in flight (a thread each); results in prompt
    order. A failed request raises, or with `return_exceptions` takes its exception's place in the list.
    `headers`, if given, holds one mapping (or None) per prompt."""
    from tqdm.auto import tqdm

    positive_int("concurrency", concurrency, "a positive number of requests in flight, e.g. 8")
    if headers is not None and len(headers) != len(prompts):
        raise ValueError(f"headers has {len(headers)} entries for {len(prompts)} prompts: give one per prompt")
    headers = headers if headers is not None else [None] * len(prompts)
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        futures = [pool.submit(stream_completion, client, model, p, max_tokens, h) for p, h in zip(prompts, headers)]
        for future in tqdm(futures, desc="requests", disable=not progress, leave=False):
            if future.exception() is not None and not return_exceptions:
                raise future.exception()
    return [f.exception() or f.result() for f in futures]
