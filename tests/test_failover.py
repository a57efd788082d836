"""Resubmitting failed streams (lab.serving.client.Retry) and the fault run's accounting (lab.serving.failover).
The real fault runs, a replica SIGKILLed behind the real router, are notebook 13's (run by nbval)."""

import math
from types import SimpleNamespace

import httpx
import openai
import pandas as pd
import pytest

from lab.serving.client import IncompleteStream, Retry, resubmittable, stream_completion
from lab.serving.failover import fault_summary, recovery_s

REQUEST = httpx.Request("POST", "http://127.0.0.1:1/v1/completions")


def chunk(text=None, usage=None):
    return SimpleNamespace(choices=[SimpleNamespace(text=text)] if text is not None else [], usage=usage)


USAGE = SimpleNamespace(prompt_tokens=40, completion_tokens=2, prompt_tokens_details=SimpleNamespace(cached_tokens=32))
COMPLETE = [chunk("a"), chunk("b"), chunk(usage=USAGE)]


class ScriptedClient:
    """Answers each send with the next item of `script`: an exception to raise, or the chunks of a stream."""

    def __init__(self, *script):
        self.script, self.sends = list(script), 0
        self.completions = SimpleNamespace(create=self.create)

    def create(self, **request):
        self.sends += 1
        outcome = self.script.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return iter(outcome)


FAST = Retry(tries=3, backoff_s=0.01)


@pytest.mark.parametrize("error, again", [
    (openai.APIConnectionError(request=REQUEST), True),
    (openai.InternalServerError("502", response=httpx.Response(502, request=REQUEST), body=None), True),
    (httpx.RemoteProtocolError("peer closed connection without sending complete message body"), True),
    (IncompleteStream("no usage"), True),
    (openai.APIError("an error event in the stream", request=REQUEST, body=None), True),
    (openai.BadRequestError("prompt too long", response=httpx.Response(400, request=REQUEST), body=None), False),
    (ValueError("a bug of ours"), False),
])
def test_only_faults_of_the_server_or_the_connection_are_resubmitted(error, again):
    assert resubmittable(error) is again


def test_a_refused_send_is_resubmitted_and_its_wait_counts_in_ttft():
    client = ScriptedClient(openai.APIConnectionError(request=REQUEST), COMPLETE)
    result = stream_completion(client, "m", "prompt", retry=Retry(tries=3, backoff_s=0.05))
    assert (client.sends, result.attempts, result.text, result.cached_tokens) == (2, 2, "ab", 32)
    assert result.first_error.startswith("APIConnectionError")
    assert result.ttft_s >= 0.05, "TTFT runs from the first send: the client waited through the backoff"


def test_a_stream_that_ends_without_its_usage_is_incomplete_and_sent_again():
    client = ScriptedClient([chunk("a")], COMPLETE)
    result = stream_completion(client, "m", "prompt", retry=FAST)
    assert result.attempts == 2 and result.first_error.startswith("IncompleteStream")
    with pytest.raises(IncompleteStream, match="without its usage"):
        stream_completion(ScriptedClient([chunk("a")]), "m", "prompt")  # no retry: the fault shows


def test_bad_input_is_never_resubmitted_and_tries_are_bounded():
    bad = openai.BadRequestError("too long", response=httpx.Response(400, request=REQUEST), body=None)
    client = ScriptedClient(bad, COMPLETE)
    with pytest.raises(openai.BadRequestError):
        stream_completion(client, "m", "prompt", retry=FAST)
    assert client.sends == 1
    refused = [openai.APIConnectionError(request=REQUEST) for _ in range(3)]
    client = ScriptedClient(*refused, COMPLETE)
    with pytest.raises(openai.APIConnectionError):
        stream_completion(client, "m", "prompt", retry=FAST)
    assert client.sends == 3, "three tries, then the last error"


@pytest.mark.parametrize("kwargs, message", [({"tries": 0}, "tries=0"), ({"backoff_s": -1}, "backoff_s >= 0"),
                                             ({"factor": 0.5}, "factor >= 1")])
def test_bad_retry_settings_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Retry(**kwargs)
    assert Retry(backoff_s=0.5, factor=2).wait_s(3) == 2.0


def requests_frame(rows):
    return pd.DataFrame(rows, columns=["prompt_tokens", "cached_tokens", "first_token_at", "attempts", "ttft_ms", "error"])


def test_recovery_is_the_first_token_from_which_every_request_hits_again():
    killed_at = 10.0
    frame = requests_frame([(100, 90, 9.0, 1, 50, None), (100, 0, 10.5, 2, 900, None), (100, 0, 11.0, 1, 400, None),
                            (100, 90, 11.5, 1, 60, None), (100, 96, 12.0, 1, 40, None)])
    assert recovery_s(frame, killed_at) == 1.5, "the misses at 10.5 and 11.0, then hits from 11.5"
    assert math.isnan(recovery_s(frame.iloc[:3], killed_at)), "never recovered within the run"
    assert recovery_s(frame.iloc[[0, 3, 4]], killed_at) == 0.0, "no miss after the kill"


def test_the_fault_summary_counts_every_request_and_the_extra_prefill():
    frame = requests_frame([(100, 90, 9.0, 1, 50, None), (100, 0, 10.5, 2, 900, None), (100, 90, 11.5, 1, 60, None),
                            (None, None, None, None, None, "APIConnectionError: gave up")])
    run = SimpleNamespace(kill_after=1, requests=frame, replicas=pd.DataFrame({"requests": [3.0]}), killed_at=10.0,
                          router_failed_sends=2)
    baseline = requests_frame([(100, 0, 1, 1, 0, None), (100, 90, 1, 1, 0, None), (100, 90, 1, 1, 0, None)])
    row = fault_summary(run, baseline)
    assert (row["sent"], row["answered"], row["resubmitted"], row["failed"]) == (4, 3, 1, 1)
    assert row["extra_prefill_tokens"] == (10 + 100 + 10) - (100 + 10 + 10)
    assert (row["p50_ttft_ms_resubmitted"], row["p50_ttft_ms_rest"]) == (900, 55)
    assert row["recovery_s"] == 1.5 and row["requests_per_survivor"] == "3"


def test_a_killed_process_restarts_on_its_port(tmp_path):
    """ManagedProcess.kill ends the group at once (a crash); restart starts the same command again."""
    import sys

    from lab.serving.processes import ManagedProcess, free_port, port_in_use

    port = free_port()
    managed = ManagedProcess("http.server", [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
                                             "--directory", str(tmp_path)], f"http://127.0.0.1:{port}/")
    managed.start(timeout_s=30)
    first = managed.process
    managed.kill()
    assert first.poll() is not None and not port_in_use(port)
    managed.restart(timeout_s=30)
    try:
        assert managed.process is not first and port_in_use(port)
    finally:
        managed.stop()
    assert not port_in_use(port)
