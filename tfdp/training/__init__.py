"""What every run does around its path's training, written once: the path contract
(``training_path``), the run skeleton, the epoch loop and the one epoch end, the report,
backups, preemption, divergence, the run folder, the export and the result."""
