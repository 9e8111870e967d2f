"""The concise path: a Keras model built in a tf.distribute strategy scope, trained with fit."""
