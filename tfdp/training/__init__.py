"""What every run does around its path's training, written once: the one entry (``entry``), the
path contract (``path_contract``), a run's life from its folder to its result (``lifecycle``),
the epoch loop and the one epoch end, the report, backups, preemption, divergence, the run
folder and the result."""
