"""The models: the from-scratch LeNet and its Keras twin, ResNet-18, yours (``catalog``), and
how the from-scratch step calls any of them (``stateless``)."""
