"""``--strategy=parameter_server``: the textbook's parameter servers (sections 12.7.3-12.7.4)
on TensorFlow's engine, ``ParameterServerStrategy`` with a ``ClusterCoordinator``
(``tfdp.paths.parameter_server.trainer``)."""
