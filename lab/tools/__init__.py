"""Repository commands: the notebook runner (`make run`), the generated reports (README.md,
docs/RESULTS.md), the JupyterLab launcher (`make lab`) and the workshop hand-outs (`make workshop`).
"""
