"""Seeing a run's steps: ``--trace_steps``' profiler capture and timeline, the replicas' and
workers' arrival times (stragglers), and the flight recorder a lost cluster's line points to."""
