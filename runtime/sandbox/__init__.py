"""Where code outside sailrl runs: worker processes with hard limits (``workers``, the child's loop
``worker_child``), the python tool's namespaces (``bubblewrap``, the runner ``snippet``), and secrets kept out of
what is written (``redact``). The validation stage imports this package.
"""
