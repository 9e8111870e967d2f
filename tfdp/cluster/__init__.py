"""The machinery of a run on many processes: TF_CONFIG, the launcher and tfdp.server's parts,
emulated hosts, network isolation, the start-up watchdog and stall detection."""
