"""``--precision`` as Keras layers take it: the input's dtype, every layer's dtype policy, and
the last layer's.

float32 and float64 put everything in that dtype. bfloat16 is mixed precision as Keras means
it: layers compute in bfloat16 and keep float32 variables (the ``mixed_bfloat16`` policy); the
images come in as float32 (each layer casts its input), and the last layer computes in float32,
so the logits, the softmax and the loss are float32.
"""

MIXED = "bfloat16"


def keras_dtypes(precision: str = "float32") -> tuple:
    """(input dtype, layer dtype policy, last layer's dtype policy) for ``precision``."""
    if precision == MIXED:
        return "float32", "mixed_bfloat16", "float32"
    return precision, precision, precision


def input_dtype(precision: str) -> str:
    """The dtype the images are fed in (float32 under mixed precision)."""
    return keras_dtypes(precision)[0]
