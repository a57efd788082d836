"""The real vLLM: the back-end in use, engine settings, the one adapter that reads vLLM internals,
the in-process engine, the server process with its client and metrics, and a fleet behind
vllm-router. Imports lab.core only."""
