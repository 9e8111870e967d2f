"""``python -m tfdp.bench``: throughput and scaling of every path side by side, and allreduce.

``table`` is the command; ``configs`` runs each configuration as a real process, ``results``
writes the table, JSON and chart. ``stock`` (stock Keras fit) and ``allreduce`` (the allreduce
micro-benchmark) are processes it starts. Across emulated hosts: ``host_training`` (training),
``host_allreduce`` (allreduce, with ``remote_allreduce`` and ``collective`` on the hosts). The
tables it produced, with their commands, are in docs/benchmarks.md.
"""
