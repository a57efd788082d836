"""Prefix Cache Lab: helpers for measuring and teaching vLLM's prefix caching.

Importing any `lab` module first sets the environment vLLM needs in a notebook (lab.backend), so the
order of imports never matters.
"""

from pathlib import Path

from lab.backend import configure_vllm_environment

PROJECT_ROOT = Path(__file__).resolve().parents[1]

configure_vllm_environment()
