"""Audit your own prompts: what prefix caching will do for them, what breaks their sharing, and what to change.

    python -m lab.audit prompts.jsonl --replicas 4     # terminal summary; HTML + JSON report under runs/audit/
    result = audit("prompts.jsonl", replicas=4)        # the same from a notebook

prompts (reading), replay (hit rates), fields (what breaks sharing), projection (throughput and TTFT),
fleet (routing and salts), core (`audit()` and its result), report (HTML, JSON, terminal), __main__.
"""

from lab.audit.core import AuditResult, audit

__all__ = ["AuditResult", "audit"]
