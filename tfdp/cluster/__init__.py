"""The in-process runtime of a run on many processes: ``TF_CONFIG``, tfdp.server's TensorFlow
server, the start-up watchdog and stall detection."""
