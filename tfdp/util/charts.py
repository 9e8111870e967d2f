"""The charts tfdp writes to files (a run's accuracy, the bench's tables, a step's timeline):
matplotlib figures of their own, drawn and saved without pyplot, which no file needs and which
is most of what importing matplotlib costs a process (docs/design.md#tests)."""


def figure(width: float, height: float):
    """An empty figure of ``width`` x ``height`` inches, for ``savefig``."""
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height))
