"""Model definitions only: the from-scratch LeNet and its Keras twin, and ResNet-18."""
