"""The from-scratch data-parallel path: replicate, split, one tape per device, allreduce, update."""
