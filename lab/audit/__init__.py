"""Audit your own prompts: what prefix caching will do for them, what breaks their sharing, and what
to change.

    python -m lab.audit prompts.jsonl --replicas 4     # terminal summary; HTML + JSON report under runs/audit/
    result = audit("prompts.jsonl", replicas=4)        # the same from a notebook
    result = audit("prompts.jsonl", AuditSettings(replicas=4, confirm=32))   # the engine confirms on 32 prompts

settings (every choice, declared once), prompts (reading), replay (hit rates), fields (what breaks
sharing), breakers (the prefix-breakers real applications have, each fix measured by replay),
projection (throughput and TTFT), routing_advice (routing and salts), core (`audit()`, section by
section), result (`AuditResult`), report (HTML, JSON, terminal), __main__; block_trace, trace_audit,
trace_fleet, trace_engine, trace_bench (block-hash traces, no text).
"""

from lab.audit.core import audit
from lab.audit.result import AuditResult
from lab.audit.settings import AuditSettings

__all__ = ["AuditResult", "AuditSettings", "audit"]
