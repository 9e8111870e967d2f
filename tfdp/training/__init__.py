"""What every run does around its path's training, written once: the run skeleton, the epoch
loop, the report, backups, preemption, the run folder, the export and the result."""
