"""Observability: lifecycle events and their hooks, Prometheus metrics (the `metrics` extra). Imports
the standard library, the core and itself (tests/unit/test_architecture.py).
"""
