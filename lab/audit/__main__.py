"""`python -m lab.audit PROMPTS.jsonl` (or `prefix-cache-audit PROMPTS.jsonl`): audit a prompts file
from the terminal.

A block-hash trace (Mooncake's or Bailian's format: `hash_ids` per line, no text) is recognised and
audited for what applies without text (lab.audit.trace_audit).

No engine starts unless asked (`--confirm N`). See lab.audit.core for what it reports; every default
is lab.audit.settings.AuditSettings's."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

from lab.audit.block_trace import is_block_trace
from lab.audit.cluster import LOCAL, ClusterError
from lab.audit.core import audit
from lab.audit.prompts import AuditInputError
from lab.audit.report import terminal_summary, write_report
from lab.audit.settings import AuditSettings, SettingsError

DEFAULTS = AuditSettings()


class _Deprecated(argparse.Action):
    """An old flag's name: stores the value under the new one's and says so on stderr."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        new = "--" + self.dest.replace("_", "-")
        print(f"warning: {option_string} is deprecated, use {new}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def parser() -> argparse.ArgumentParser:
    d = DEFAULTS
    cli = argparse.ArgumentParser(prog="python -m lab.audit", description=__doc__.split("\n\n")[0])
    cli.add_argument(
        "prompts",
        help="JSONL (.jsonl, .jsonl.gz) or Parquet, or a folder or quoted glob of such shards "
        'read as one log: one {"prompt": ...}, {"messages": [...], "tools": [...]} or '
        '{"token_ids": [...]} (as the engine was sent them) per line; with "timestamp" (ISO 8601 or epoch seconds) or '
        '"arrival_s", replayed in arrival order; optional "tenant" and "cache_salt"',
    )
    cli.add_argument(
        "--model",
        default=d.model,
        help="local Hugging Face model directory for the tokenizer (default: the lab's)",
    )
    cli.add_argument(
        "--kv-tokens",
        type=int,
        default=d.kv_tokens,
        help="KV cache capacity in tokens (%(default)s)",
    )
    cli.add_argument(
        "--block-sizes",
        type=int,
        nargs="+",
        default=d.block_sizes,
        help="default: the sizes this back-end accepts",
    )
    cli.add_argument(
        "--replicas",
        type=int,
        default=d.replicas,
        help="replicas of the simulated fleet (%(default)s)",
    )
    cli.add_argument(
        "--confirm",
        type=int,
        default=d.confirm,
        metavar="N",
        help="run the first N prompts on the real engine, caching off and on (%(default)s: no engine "
        "starts); a cost model of the engine is fitted first if this model and back-end have none",
    )
    cli.add_argument(
        "--output-tokens",
        type=int,
        default=d.output_tokens,
        help="answer length the projection assumes (%(default)s)",
    )
    cli.add_argument(
        "--explained",
        type=int,
        default=d.explained,
        metavar="N",
        help="the first N requests (arrival order) whose misses are explained and routed on a simulated "
        "fleet (%(default)s; every request counts in the hit rates)",
    )
    cli.add_argument(
        "--explain",
        type=int,
        dest="explained",
        action=_Deprecated,
        default=argparse.SUPPRESS,
        help=argparse.SUPPRESS,
    )  # the old name of --explained
    cli.add_argument(
        "--field-sample",
        type=int,
        default=d.field_sample,
        metavar="N",
        help="the first N requests searched for fields and other prefix-breakers (%(default)s)",
    )
    cli.add_argument(
        "--workers",
        type=int,
        default=None,
        help=f"processes that read the log ({d.workers}: the tokenizer's threads use every core; more "
        "processes pay on machines with more cores); with --ray alone, the local cluster's CPUs (default: "
        "every core)",
    )
    cli.add_argument(
        "--ray",
        nargs="?",
        const=LOCAL,
        default=d.ray,
        metavar="ADDRESS",
        help="read, tokenize and hash the log, and run its replays, on a Ray cluster: alone, one started "
        "on this machine and stopped after; with an address (e.g. auto, ray://head:10001), that "
        "cluster's CPUs. The numbers equal a single process's",
    )
    cli.add_argument(
        "--skip-bad",
        action="store_true",
        default=d.skip_bad,
        help="skip and count bad lines instead of stopping",
    )
    cli.add_argument("--out", help="report folder (default: runs/audit/)")
    return cli


def settings_from(args: argparse.Namespace) -> AuditSettings:
    """The settings the parsed command line names (those it has no flag for keep their defaults)."""
    given = dict(vars(args))
    if given.get("workers") is None:
        given["workers"] = (os.cpu_count() or 1) if given.get("ray") == LOCAL else DEFAULTS.workers
    return AuditSettings.build(
        **{f.name: given[f.name] for f in dataclasses.fields(AuditSettings) if f.name in given}
    )


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        settings = settings_from(args)
    except SettingsError as error:
        print(f"error: --{error.name.replace('_', '-')}: {error}", file=sys.stderr)
        return 2
    try:
        if is_block_trace(args.prompts):
            return _trace(args.prompts, settings, args.out)
        result = audit(args.prompts, settings)
    except (AuditInputError, ClusterError, ValueError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(terminal_summary(result))
    for written in write_report(result, args.out):
        print(f"wrote {written}")
    return 0


def _trace(path: str, settings: AuditSettings, out: str | None) -> int:
    from lab.audit import trace_audit

    if ignored := trace_audit.ignored_settings(settings):
        print(
            f"warning: {path} is a block-hash trace (no text): {', '.join(ignored)} ignored; it is audited at "
            "--kv-tokens per node and --replicas nodes",
            file=sys.stderr,
        )
    result = trace_audit.audit_trace(path, settings)
    print(trace_audit.summary(result))
    print(f"wrote {trace_audit.write(result, out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
