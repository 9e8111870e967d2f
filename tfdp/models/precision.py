"""``--precision`` as Keras layers take it: the input's dtype, every layer's dtype policy, and
the last layer's.

float32 and float64 put everything in that dtype. bfloat16 is mixed precision as Keras means
it: layers compute in bfloat16 and keep float32 variables (the ``mixed_bfloat16`` policy); the
images come in as float32 (each layer casts its input), and the last layer computes in float32,
so the logits, the softmax and the loss are float32.
"""

MIXED = "bfloat16"
# --precision=auto computes in bfloat16 on a machine that multiplies matrices in it at least this
# much faster than in float32: a step is more than its matrix products (convolutions, batch
# normalization, the update), and gains less than they do (docs/time-to-accuracy.md).
AUTO_BFLOAT16_FROM = 1.2


def keras_dtypes(precision: str = "float32") -> tuple:
    """(input dtype, layer dtype policy, last layer's dtype policy) for ``precision``."""
    if precision == MIXED:
        return "float32", "mixed_bfloat16", "float32"
    return precision, precision, precision


def resolve(precision: str) -> str:
    """``--precision`` as this machine runs it: ``auto`` becomes bfloat16 where bfloat16's
    measured speed (``tfdp.util.devices.bfloat16_speed``, once per machine) reaches
    ``AUTO_BFLOAT16_FROM``, float32 elsewhere; any other value stays as given."""
    if precision != "auto":
        return precision
    from tfdp.util.devices import bfloat16_speed
    from tfdp.util.logs import logger

    speed = bfloat16_speed()
    chosen = MIXED if speed >= AUTO_BFLOAT16_FROM else "float32"
    logger.info(
        "--precision=auto: %s (this machine multiplies matrices in bfloat16 at %.2fx float32's "
        "speed, measured once and cached; bfloat16 from %.1fx)", chosen, speed, AUTO_BFLOAT16_FROM)
    return chosen


def input_dtype(precision: str) -> str:
    """The dtype the images are fed in (float32 under mixed precision)."""
    return keras_dtypes(precision)[0]
