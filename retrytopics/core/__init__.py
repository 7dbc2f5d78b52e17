"""The pure core: values and decisions (policy, naming, headers, routing, the per-record step, signing,
redaction, the ports). Imports only the standard library and itself; no I/O; the time and
randomness come in as arguments (tests/unit/test_architecture.py).
"""
