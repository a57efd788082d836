"""Reading a prompts file: JSONL lines, gzipped or not, or Parquet rows (a prompt, or chat messages
rendered with the model's template, tools included, as the server renders them), in arrival order
when the records say when they came (`arrival_s`, or a `timestamp`: ISO 8601, epoch seconds or a
Parquet timestamp), tokenized, with every bad record named by file, line (or row) and fix."""

from __future__ import annotations

import gzip
import io
import itertools
import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import numpy as np

from lab.audit.piece_tokens import TokenEncoder
from lab.audit.shards import AuditInputError, shard_paths


@dataclass
class Prompts:
    """What was read: texts and token ids in replay order, each line's number, optional tenants."""

    path: str
    texts: list[str]
    token_ids: list[list[int]]
    lines: list[int]
    tenants: list[str | None]
    salts: list[str | None]  # each request's cache_salt, if the file gives one
    skipped: list[str] = field(
        default_factory=list
    )  # one message per bad line skipped with skip_bad
    arrivals: list[float | None] = field(
        default_factory=list
    )  # each request's arrival (seconds), if the file says
    chats: list[dict | None] = field(
        default_factory=list
    )  # a chat's {"messages", "tools"} as sent (None: a prompt)
    ids_given: list[bool] = field(
        default_factory=list
    )  # the line gave its token ids (its text is their decoding)

    def head(self, n: int) -> Prompts:
        """The first `n` requests."""
        return Prompts(
            self.path,
            self.texts[:n],
            self.token_ids[:n],
            self.lines[:n],
            self.tenants[:n],
            self.salts[:n],
            self.skipped,
            self.arrivals[:n],
            self.chats[:n],
            self.ids_given[:n],
        )


def load_tokenizer(model: str | None):
    """The tokenizer of `model` (a local Hugging Face model directory, whose tokenizer files are
    enough; None: the lab's model, which only a checkout of the lab can build)."""
    from lab import IN_CHECKOUT
    from lab.core.model import tokenizer_for
    from lab.serving.engine_settings import resolve_model

    if model is None and not IN_CHECKOUT:
        raise AuditInputError(
            "--model is needed: the lab's own model is built from its repository's corpus, which an "
            "installed package does not carry; pass a local Hugging Face model directory (its "
            "tokenizer files are enough), the model whose tokens your engine caches"
        )
    directory = None if model is None else Path(model).expanduser()
    # a directory needs only its tokenizer files; anything else is resolved as an engine would load
    # it
    try:
        return tokenizer_for(
            directory if directory is not None and directory.is_dir() else resolve_model(model)
        )
    except Exception as error:  # transformers raises OSError, ValueError or its own errors
        raise AuditInputError(
            f"--model {model}: cannot load a tokenizer from it ({type(error).__name__}: {error}); "
            "pass a local Hugging Face model directory with tokenizer files"
            + (", or leave --model out to use the lab's model" if IN_CHECKOUT else "")
        ) from error


def _record_text(
    record: object, tokenizer, where: str
) -> tuple[str, dict | None, list[int] | None]:
    """The prompt text of one record, the chat it rendered with the model's template ({"messages",
    "tools"}; None for a plain prompt), and its token ids where the record gives them (`token_ids`:
    audited as given, never re-encoded; its text is their decoding)."""
    if not isinstance(record, dict) or not (
        "prompt" in record or "messages" in record or "token_ids" in record
    ):
        raise AuditInputError(
            f"{where}: has neither 'prompt' nor 'messages' nor 'token_ids'; write "
            '{"prompt": "..."}, {"messages": [{"role": "user", "content": "..."}]} or '
            '{"token_ids": [1, 2, ...]}'
        )
    if "token_ids" in record:
        ids = record["token_ids"]
        if (
            not isinstance(ids, list)
            or not ids
            or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids)
        ):
            raise AuditInputError(
                f"{where}: 'token_ids' must be a non-empty list of token ids (whole numbers >= 0)"
            )
        return tokenizer.decode(ids), None, ids
    if "prompt" in record:
        if not isinstance(record["prompt"], str) or not record["prompt"]:
            raise AuditInputError(f"{where}: 'prompt' must be a non-empty string")
        return record["prompt"], None, None
    messages, tools = record["messages"], record.get("tools")
    if (
        not isinstance(messages, list)
        or not messages
        or not all(isinstance(m, dict) and "content" in m for m in messages)
    ):
        raise AuditInputError(
            f"{where}: 'messages' must be a non-empty list of {{'role': ..., 'content': ...}}"
        )
    if tools is not None and not (
        isinstance(tools, list) and all(isinstance(t, dict) for t in tools)
    ):
        raise AuditInputError(
            f"{where}: 'tools' must be a list of tool definitions, as in the OpenAI API"
        )
    if not getattr(tokenizer, "chat_template", None):
        raise AuditInputError(
            f"{where}: 'messages' needs a chat template, and this model's tokenizer has none; "
            "send rendered prompts as 'prompt', or choose a chat model with --model"
        )
    text = tokenizer.apply_chat_template(
        messages, tools=tools, tokenize=False, add_generation_prompt=True
    )
    return text, {"messages": messages, "tools": tools}, None


def _arrival(record: dict, where: str) -> float | None:
    """When a line's request arrived, in seconds: `arrival_s`, else a `timestamp` (ISO 8601 or epoch
    seconds)."""
    if (arrival := record.get("arrival_s")) is not None:
        if not isinstance(arrival, (int, float)) or isinstance(arrival, bool):
            raise AuditInputError(
                f"{where}: 'arrival_s' must be a number of seconds, not {arrival!r}"
            )
        return float(arrival)
    stamp = record.get("timestamp")
    if stamp is None:
        return None
    if isinstance(stamp, (int, float)) and not isinstance(stamp, bool):
        return float(stamp)
    if isinstance(stamp, datetime):  # a Parquet timestamp column
        return stamp.timestamp()
    try:
        return datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise AuditInputError(
            f"{where}: 'timestamp' {stamp!r} is neither ISO 8601 (e.g. 2026-12-01T09:00:00Z) "
            "nor epoch seconds"
        ) from None


def _parquet_rows(path: Path) -> Iterator[tuple[str, dict]]:
    """(where, record) per row of a Parquet file, read a batch at a time; null fields are left out."""
    import pyarrow.parquet as pq

    try:
        rows = pq.ParquetFile(path)
    except (
        Exception
    ) as error:  # pyarrow raises ArrowInvalid or OSError on a file that is not Parquet
        raise AuditInputError(
            f"{path}: not a Parquet file ({error}); write JSONL, or Parquet with a 'prompt' or "
            "'messages' column"
        ) from error
    number = 0
    for batch in rows.iter_batches(batch_size=10_000):
        for row in batch.to_pylist():
            number += 1
            yield (
                f"{path}: row {number}",
                {key: value for key, value in row.items() if value is not None},
            )


def _jsonl_line(raw: bytes, where: str) -> dict | None:
    """One JSONL line's record (None for a blank line)."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise AuditInputError(
            f"{where}: not UTF-8 (byte {error.start + 1} of the line is "
            f"{raw[error.start : error.start + 1]!r}); save the file as UTF-8"
        ) from None
    if not line.strip():
        return None
    try:
        return json.loads(line)
    except json.JSONDecodeError as error:
        raise AuditInputError(
            f"{where}: not JSON ({error.msg}); each line must be one object, e.g. "
            '{"prompt": "..."}'
        ) from error


def raw_records(path: str | Path) -> Iterator[tuple[str, int, bytes | dict]]:
    """(where, number, raw line or record) for every line of a JSONL file (gzipped or not) or row of
    a Parquet file, not yet parsed (good_records parses them). `path` may name shards
    (lab.audit.shards): their records follow one another in name order, numbered across them, each
    `where` naming its shard and line."""
    number = 0
    for shard in shard_paths(path):
        for where, raw in _file_records(shard):
            number += 1
            yield where, number, raw


def _file_records(path: Path) -> Iterator[tuple[str, bytes | dict]]:
    if path.suffix == ".parquet":
        yield from _parquet_rows(path)
        return
    with gzip.open(path, "rb") if path.suffix == ".gz" else path.open("rb") as f:
        lines = (
            io.BufferedReader(f, buffer_size=2**20) if path.suffix == ".gz" else f
        )  # a line at a time from gzip
        for number, raw in enumerate(lines, start=1):  # is slow unbuffered
            yield f"{path}:{number}", raw


def _good_records(path: Path, tokenizer, skip_bad: bool, skipped: list[str]) -> Iterator[dict]:
    return good_records(raw_records(path), tokenizer, skip_bad, skipped)


def good_records(
    records: Iterable[tuple[str, int, bytes | dict]], tokenizer, skip_bad: bool, skipped: list[str]
) -> Iterator[dict]:
    """One entry per good record of `records` (raw_records), in order: text, its number, arrival
    time, tenant, salt, and its chat messages and tools (None for a plain prompt); a bad one raises,
    or with `skip_bad` is listed in `skipped`."""
    for where, number, raw in records:
        try:
            record = _jsonl_line(raw, where) if isinstance(raw, bytes) else raw
            if record is None:
                continue
            text, chat, ids = _record_text(record, tokenizer, where)
            arrival = _arrival(record, where)
            tenant, salt = record.get("tenant", record.get("user")), record.get("cache_salt")
            if salt is not None and (not isinstance(salt, str) or not salt):
                raise AuditInputError(
                    f"{where}: 'cache_salt' must be a non-empty string, not {salt!r}"
                )
            yield {
                "text": text,
                "line": number,
                "arrival_s": arrival,
                "chat": chat,
                "ids": ids,
                "tenant": None if tenant is None else str(tenant),
                "salt": salt,
            }
        except AuditInputError as error:
            if not skip_bad:
                raise AuditInputError(
                    f"{error} (--skip-bad skips bad lines and counts them)"
                ) from None
            skipped.append(str(error))


def _check_file(path: str | Path) -> None:
    shard_paths(path)  # raises, naming what would work, where it names no file


CHUNK_RECORDS = (
    1000  # records tokenized in one call: the tokenizer's batch, and the unit of the progress bar
)


@dataclass
class BadLines:
    """What happens to a bad line of `path`: it raises AuditInputError naming the file and line, or
    with `skip_bad` its message is listed in `skipped`."""

    path: str | Path
    skip_bad: bool = False
    skipped: list[str] = field(default_factory=list)

    def reject(self, message: str) -> None:
        if not self.skip_bad:
            raise AuditInputError(message + " (--skip-bad skips bad lines and counts them)")
        self.skipped.append(message)


def tokenized_chunks(
    path: str | Path,
    tokenizer,
    *,
    skipped: list[str],
    max_model_len: int | None = None,
    skip_bad: bool = False,
) -> Iterator[list[tuple[dict, list[int]]]]:
    """The good records of a prompts file with their token ids, CHUNK_RECORDS at a time, in file
    order. A prompt longer than the model's context is a bad record too. Bad records raise
    AuditInputError naming the file and line, or with `skip_bad` are listed in `skipped`; a file
    with no good record raises at the end."""
    path = Path(path)
    _check_file(path)
    limit = max_model_len or getattr(tokenizer, "model_max_length", None)
    bad = BadLines(path, skip_bad, skipped)
    records, found, encoder = (
        _good_records(path, tokenizer, skip_bad, skipped),
        0,
        TokenEncoder(tokenizer),
    )
    while batch := list(itertools.islice(records, CHUNK_RECORDS)):
        found += len(batch)
        yield tokenize_batch(batch, encoder, bad, limit=limit)
    if not found:
        raise_nothing_to_audit(path, skipped)


def tokenize_batch(
    batch: list[dict],
    encoder: TokenEncoder,
    bad: BadLines,
    *,
    limit: int | None,
    arrays: bool = False,
) -> list[tuple[dict, list[int] | np.ndarray]]:
    """The good records of one batch (good_records) with their token ids (`arrays`: as numpy
    arrays); one longer than `limit` tokens is a bad record too, handed to `bad`."""
    ids_of = encoder.arrays if arrays else encoder.ids
    plain = iter(ids_of([g["text"] for g in batch if not g["chat"] and g["ids"] is None]))
    chats = iter(ids_of([g["text"] for g in batch if g["chat"]], add_special_tokens=False))
    kept = []
    for g in batch:
        if g["ids"] is not None:
            ids = np.asarray(g["ids"], dtype=np.int64) if arrays else list(g["ids"])
        else:
            ids = next(chats) if g["chat"] else next(plain)
        if limit and len(ids) > limit:
            bad.reject(
                f"{bad.path}:{g['line']}: {len(ids)} tokens, longer than the model's context of {limit}; "
                "shorten it, or audit with a model whose context holds it (--model)"
            )
            continue
        kept.append((g, ids))
    return kept


def raise_nothing_to_audit(path: str | Path, skipped: list[str]) -> None:
    reason = f"all {len(skipped)} lines are bad" if skipped else "it is empty"
    raise AuditInputError(
        f"{path}: nothing to audit, {reason}; write one JSON object per line, "
        'e.g. {"prompt": "You are a support bot. ..."}'
    )


def arrival_key(arrival_s: float | None, position: int) -> tuple[bool, float, int]:
    """Replay order: by arrival time where the log gives one, then the rest in file order."""
    return arrival_s is None, arrival_s or 0.0, position


def read_prompts(
    path: str | Path,
    tokenizer,
    *,
    max_model_len: int | None = None,
    skip_bad: bool = False,
    progress: bool = True,
) -> Prompts:
    """Read and tokenize a prompts file (`.jsonl`, `.jsonl.gz` or `.parquet`), in arrival order when
    it gives arrival times or timestamps (lines without one keep their place after those with one).
    Bad lines raise AuditInputError naming the file and line, or with `skip_bad` are skipped and
    listed in `skipped`. Everything is held in memory: for a large log,
    `lab.audit.trace.read_trace`."""
    from tqdm.auto import tqdm

    skipped: list[str] = []
    chunks = tokenized_chunks(
        path, tokenizer, skipped=skipped, max_model_len=max_model_len, skip_bad=skip_bad
    )
    kept = [
        item
        for chunk in tqdm(
            chunks,
            desc="reading and tokenizing",
            unit="k prompts",
            disable=not progress,
            leave=False,
        )
        for item in chunk
    ]
    if not kept:
        raise AuditInputError(
            f"{path}: nothing to audit, every prompt is longer than the model's context"
        )
    order = sorted(range(len(kept)), key=lambda i: arrival_key(kept[i][0]["arrival_s"], i))
    kept = [kept[i] for i in order]
    return prompts_from(str(path), kept, skipped)


def prompts_from(path: str, kept: list[tuple[dict, list[int]]], skipped: list[str]) -> Prompts:
    """Prompts from good records (good_records) paired with their token ids, in replay order."""
    return Prompts(
        path,
        [g["text"] for g, _ in kept],
        [ids for _, ids in kept],
        [g["line"] for g, _ in kept],
        [g["tenant"] for g, _ in kept],
        [g["salt"] for g, _ in kept],
        skipped,
        [g["arrival_s"] for g, _ in kept],
        [g["chat"] for g, _ in kept],
        [g["ids"] is not None for g, _ in kept],
    )


def encode(encoder: TokenEncoder, texts: Sequence[str]) -> list[list[int]]:
    """The token ids of every text, a thousand texts at a time."""
    return [
        ids
        for start in range(0, len(texts), 1000)
        for ids in encoder.ids(texts[start : start + 1000])
    ]
