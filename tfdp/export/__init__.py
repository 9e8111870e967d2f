"""The export, written once: the SavedModel with the serving contract (``saved_model``), the
other formats beside it (``formats``), and ``python -m tfdp.export`` (``command``)."""
