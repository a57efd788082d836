"""`python -m lab.audit PROMPTS.jsonl` (or `prefix-cache-audit PROMPTS.jsonl`): audit a prompts file from the terminal.

See lab.audit.core for what it reports."""

from __future__ import annotations

import argparse
import sys

from lab.audit.core import audit
from lab.audit.prompts import DEFAULT_KV_TOKENS, AuditInputError
from lab.audit.report import terminal_summary, write_report


def main(argv: list[str] | None = None) -> int:

    parser = argparse.ArgumentParser(prog="python -m lab.audit", description=__doc__.split("\n\n")[0])
    parser.add_argument("prompts", help="JSONL (.jsonl, .jsonl.gz) or Parquet: one {\"prompt\": ...} or {\"messages\": [...], "
                        "\"tools\": [...]} per line; with \"timestamp\" (ISO 8601 or epoch seconds) or \"arrival_s\", "
                        "replayed in arrival order; optional \"tenant\" and \"cache_salt\"")
    parser.add_argument("--model", help="local Hugging Face model directory for the tokenizer (default: the lab's)")
    parser.add_argument("--kv-tokens", type=int, default=DEFAULT_KV_TOKENS, help="KV cache capacity in tokens")
    parser.add_argument("--block-sizes", type=int, nargs="+", help="default: the sizes this back-end accepts")
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--confirm", type=int, default=32, help="prompts run on the real engine (0: none); with an "
                        "engine, a cost model of it is fitted first if this model and back-end have none")
    parser.add_argument("--output-tokens", type=int, default=8, help="answer length the projection assumes")
    parser.add_argument("--explain", type=int, default=5_000, help="the first requests (arrival order) whose misses "
                        "are explained and routed on a simulated fleet (every request counts in the hit rates)")
    parser.add_argument("--workers", type=int, default=1, help="processes that read the log (default 1: the "
                        "tokenizer's threads use every core; more processes pay on machines with more cores)")
    parser.add_argument("--skip-bad", action="store_true", help="skip and count bad lines instead of stopping")
    parser.add_argument("--out", help="report folder (default: runs/audit/)")
    args = parser.parse_args(argv)
    try:
        result = audit(args.prompts, model=args.model, kv_tokens=args.kv_tokens, block_sizes=args.block_sizes,
                       replicas=args.replicas, confirm=args.confirm, output_tokens=args.output_tokens,
                       fleet_sample=args.explain, skip_bad=args.skip_bad, workers=args.workers)
    except (AuditInputError, ValueError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(terminal_summary(result))
    for written in write_report(result, args.out):
        print(f"wrote {written}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
