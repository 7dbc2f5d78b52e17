"""The operator's side: the `retrytopics` command line, its config file, pipeline operations,
preflight checks, the demo, reports, charts, progress lines and log formats. Nothing outside operator,
console and the Spark jobs imports it (tests/unit/test_architecture.py).
"""
