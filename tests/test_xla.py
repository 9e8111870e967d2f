"""``--jit_compile``: XLA compiles each replica's forward and backward pass on the from-scratch
path and Keras' step under ``plain``, and trains the model the kernels alone train (float64:
the same to rounding). The paths that cannot take it refuse it in one line (test_config); its
speed on each path is the bench's (``tfdp.bench --configs=manual:2,manual:2:jit,...``)."""

import numpy as np
import pytest
import tensorflow as tf

from same_model import update_difference
from tfdp.config.settings import Config
from tfdp.models import lenet
from tfdp.training import entry


@pytest.mark.parametrize("strategy, devices", [("manual", 2), ("plain", 1)])
@pytest.mark.slow
def test_xla_trains_what_the_kernels_train(tmp_path, data_dir, monkeypatch, strategy, devices):
    start = lenet.init_params(6, np.float64, "glorot", batch_norm=True)
    compiled = []
    function = tf.function

    def watched(*args, **kwargs):  # Which functions are made XLA computations (Keras' conv
        if kwargs.get("jit_compile") and args:  # makes a decorator it does not use on NHWC).
            compiled.append(args[0].__qualname__)
        return function(*args, **kwargs)

    monkeypatch.setattr(tf, "function", watched)
    runs = {}
    for jit in (False, True):
        config = Config(strategy=strategy, num_gpus=devices, recipe="fast", batch_size=64,
                        epochs=2, steps_per_epoch=4, eval_steps=1, precision="float64",
                        jit_compile=jit, data_dir=data_dir, workdir=str(tmp_path / f"{jit}"),
                        export_dir=str(tmp_path / f"{jit}-export"))
        asked = len(compiled)
        runs[jit] = entry.train(config, start_weights=lenet.to_keras_weights(start),
                                       export=False)
        assert (len(compiled) > asked) == jit, compiled[asked:]
    kernels, xla = (lenet.from_keras_weights(runs[jit].weights) for jit in (False, True))
    assert update_difference(xla, kernels, start) < 1e-9
