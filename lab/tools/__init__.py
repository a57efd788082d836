"""Repository commands: the notebook runner (`make run`), the README report, the JupyterLab launcher
(`make lab`) and the workshop hand-outs (`make workshop`)."""
