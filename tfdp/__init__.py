"""tfdp: data-parallel training of image classifiers with TensorFlow 2 and Keras 3.

Two paths share flags, data, models, report and export:

* ``tfdp.manual``: the textbook algorithm written out (replicate, split, one tape per device,
  allreduce, the same update everywhere);
* ``tfdp.keras_path``: Keras ``fit`` under ``MirroredStrategy`` / ``MultiWorkerMirroredStrategy``.
"""

__version__ = "0.1.0"
