"""``python -m tfdp.bench``: throughput and scaling of every path side by side, and allreduce.

``table`` is the command (runs configurations as real processes, writes the table, JSON and
chart); ``stock`` (stock Keras fit) and ``allreduce`` (the allreduce micro-benchmark) are the
processes it starts. Each is a command with absl flags of its own. The tables it produced, with
their commands, are in docs/benchmarks.md.
"""
