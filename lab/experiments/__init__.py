"""What the notebooks run: workloads (every prompt generator), measurement, capacity, vLLM's
benchmark client, the fleet simulator, results files with provenance, figures, the article's claims.
Imports lab.core and lab.serving."""
