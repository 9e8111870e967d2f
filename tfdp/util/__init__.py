"""What every layer uses: one-line errors, what a run prints, files written atomically and
locked, the charts' figure, and this machine's devices."""
