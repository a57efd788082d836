"""Prefix Cache Lab: helpers for measuring and teaching vLLM's prefix caching."""

from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]
