"""The configuration, read without TensorFlow: ``Config`` and its flags (``settings``), their
checks, the command line made from a ``Config``, the recipes, the run's arithmetic (``plan``) and
the forms of ``--model``, ``--dataset`` and ``--optimizer``."""
