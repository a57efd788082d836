"""The real OpenAI client against a lab server or router: one streamed completion with TTFT as the
client sees it and the usage the server reports, resubmitted (with `Retry`) when its stream fails,
and many at once on a thread pool."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx
import openai

from lab.checks import positive_int


def openai_client(base_url: str):
    """The real OpenAI client for a lab server or router (no retries of its own: `Retry` says when
    to resubmit)."""
    return openai.OpenAI(base_url=base_url, api_key="not-needed", max_retries=0, timeout=600)


class IncompleteStream(RuntimeError):
    """The stream ended without its final usage chunk: the server (or the replica behind a router)
    went away."""


@dataclass(frozen=True)
class Retry:
    """Send a request again when its stream failed before it was complete: a connection refused or
    broken, a 5xx answer, an error event in the stream, or a stream cut short. At most `tries` sends
    in all, waiting `backoff_s` before the second, `factor` times longer before each one after. A
    4xx answer (bad input) is never resubmitted."""

    tries: int = 3
    backoff_s: float = 0.25
    factor: float = 2.0

    def __post_init__(self) -> None:
        positive_int("tries", self.tries, "the most sends of one request, e.g. 3")
        if not self.backoff_s >= 0 or not self.factor >= 1:
            raise ValueError(
                f"Retry(backoff_s={self.backoff_s!r}, factor={self.factor!r}): use backoff_s >= 0 "
                "and factor >= 1"
            )

    def wait_s(self, attempt: int) -> float:
        """The pause after failed send number `attempt` (1-based)."""
        return self.backoff_s * self.factor ** (attempt - 1)


NO_RETRY = Retry(tries=1)


@dataclass(frozen=True)
class Sending:
    """How a workload is sent: at most `concurrency` requests in flight (a thread each),
    `max_tokens` output tokens each, a failed stream resubmitted as `retry` allows, and a progress
    bar unless `progress` is False."""

    concurrency: int
    max_tokens: int = 8
    retry: Retry = NO_RETRY
    progress: bool = True

    def __post_init__(self) -> None:
        positive_int(
            "concurrency", self.concurrency, "a positive number of requests in flight, e.g. 8"
        )
        positive_int("max_tokens", self.max_tokens, "a positive number of output tokens, e.g. 8")


def resubmittable(error: BaseException) -> bool:
    """Whether a failed stream may be sent again: the request never got a complete answer, and the
    fault was the server's or the connection's, not the request's."""
    if isinstance(
        error,
        (
            IncompleteStream,
            openai.APIConnectionError,
            openai.InternalServerError,
            httpx.TransportError,
        ),
    ):
        return True
    return (
        type(error) is openai.APIError
    )  # an error event inside the stream (a status error has a subclass)


@dataclass
class StreamResult:
    ttft_s: float  # client side: first send to first streamed token of the answered send
    e2e_s: float
    text: str
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    attempts: int = 1  # sends it took; above 1, earlier sends failed and were resubmitted
    first_error: str | None = None  # why the first send failed, when it did
    started_at: float = 0.0  # time.perf_counter() at the first send


def stream_completion(
    client,
    model: str,
    prompt: str | Sequence[int],
    max_tokens: int = 8,
    headers: Mapping[str, str] | None = None,
    retry: Retry = NO_RETRY,
    **extra_body,
) -> StreamResult:
    """One streamed completion; TTFT as the client sees it (from the first send, so a resubmission's
    wait counts), and the usage the server reports. `headers` are sent with the request (e.g. a
    session key for a router); `retry` resubmits a failed stream."""
    start, first_error = time.perf_counter(), None
    for attempt in range(1, retry.tries + 1):
        try:
            result = _stream_once(client, model, prompt, max_tokens, headers, extra_body, start)
        except Exception as error:
            if attempt == retry.tries or not resubmittable(error):
                raise
            first_error = first_error or f"{type(error).__name__}: {error}"
            time.sleep(retry.wait_s(attempt))
            continue
        result.attempts, result.first_error, result.started_at = attempt, first_error, start
        return result
    raise AssertionError("unreachable: the last attempt returns or raises")


def _stream_once(
    client, model: str, prompt, max_tokens: int, headers, extra_body: dict, start: float
) -> StreamResult:
    stream = client.completions.create(
        model=model,
        prompt=prompt,
        max_tokens=max_tokens,
        temperature=0.0,
        stream=True,
        stream_options={"include_usage": True},
        extra_headers=headers,
        extra_body=extra_body or None,
    )
    first, text, usage = None, [], None
    for chunk in stream:
        if (
            chunk.choices
        ):  # a token arrived (its text may be empty until a UTF-8 character completes)
            first = first or time.perf_counter()
            text.append(chunk.choices[0].text or "")
        if chunk.usage is not None:
            usage = chunk.usage
    end = time.perf_counter()
    if usage is None:
        raise IncompleteStream(f"the stream ended after {len(text)} chunks without its usage")
    details = getattr(usage, "prompt_tokens_details", None)
    return StreamResult(
        ttft_s=(first or end) - start,
        e2e_s=end - start,
        text="".join(text),
        prompt_tokens=usage.prompt_tokens,
        cached_tokens=(details.cached_tokens or 0) if details else 0,
        completion_tokens=usage.completion_tokens,
    )


def complete_concurrently(
    client,
    model: str,
    prompts: Sequence[str],
    sending: Sending,
    *,
    return_exceptions: bool = False,
    headers: Sequence[Mapping[str, str] | None] | None = None,
) -> list[StreamResult | Exception]:
    """Stream every prompt as `sending` says; results in prompt order. A failed request (after the
    retry's resubmissions) raises, or with `return_exceptions` takes its exception's place in the
    list. `headers`, if given, holds one mapping (or None) per prompt."""
    from tqdm.auto import tqdm

    if headers is not None and len(headers) != len(prompts):
        raise ValueError(
            f"headers has {len(headers)} entries for {len(prompts)} prompts: give one per prompt"
        )
    headers = headers if headers is not None else [None] * len(prompts)
    with ThreadPoolExecutor(max_workers=sending.concurrency) as pool:
        futures = [
            pool.submit(stream_completion, client, model, p, sending.max_tokens, h, sending.retry)
            for p, h in zip(prompts, headers)
        ]
        for future in tqdm(futures, desc="requests", disable=not sending.progress, leave=False):
            if future.exception() is not None and not return_exceptions:
                raise future.exception()
    return [f.exception() or f.result() for f in futures]
