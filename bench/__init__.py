"""Benchmarks: the runtime against the raw confluent-kafka client, in the same run, on the same broker.

Run ``python -m bench [--quick] [--only SCENARIO]``; see docs/benchmarks.md for how to read the output.
"""
