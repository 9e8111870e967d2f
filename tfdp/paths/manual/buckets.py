"""When gradients travel (section 12.3.2): overlapping the allreduce with the backward pass.

TensorFlow's executor runs an op as soon as its inputs exist, so an allreduce that needs only
some gradients can start while the backward pass is still computing the others. How much of the
exchange can overlap depends on what each allreduce call waits for:

* ``add_n`` and ``sharded`` sum each parameter on its own: a parameter's sum starts once that
  parameter's gradients exist on every replica (``--overlap=auto``, the default);
* ``ring`` flattens all gradients into one vector first, so it waits for the whole backward
  pass, unless the gradients are cut into **buckets** (``--bucket_kb=N``): gradients packed in
  the order the backward pass produces them (the last layer's first), at most N KB each (a
  larger parameter alone), one allreduce per bucket (PyTorch DDP's ``bucket_cap_mb``, Horovod's
  tensor fusion);
* ``--overlap=none`` holds every allreduce until every gradient of every replica exists: the
  barrier that overlap is measured against.
"""

import tensorflow as tf


def backward_order(params: list) -> list:
    """The indices of ``params`` in the order the backward pass produces their gradients: the
    last layer's first (LeNet's parameters are listed from the first layer)."""
    return list(reversed(range(len(params))))


def buckets(sizes: list, order: list, cap_bytes: int) -> list:
    """Indices in ``order`` packed into consecutive buckets of at most ``cap_bytes`` (``sizes``
    in bytes, by index); a parameter larger than the cap is a bucket of its own."""
    packed, current, filled = [], [], 0
    for i in order:
        if current and filled + sizes[i] > cap_bytes:
            packed.append(current)
            current, filled = [], 0
        current.append(i)
        filled += sizes[i]
    return packed + ([current] if current else [])


def exchange(grads: list, devices: list, reduce, bucket_kb: int = None,
             overlap: bool = True) -> list:
    """``reduce(grads, devices)`` (``grads[d][i]``: gradient i on device d), in buckets of
    ``bucket_kb`` KB when given, after every gradient exists when not ``overlap``."""
    if not overlap:
        everything = [g for per_device in grads for g in per_device]
        held = []
        for device, per_device in zip(devices, grads):
            with tf.device(device), tf.control_dependencies(everything):
                held.append([tf.identity(g) for g in per_device])
        grads = held
    if not bucket_kb:
        return reduce(grads, devices)
    first = grads[0]
    sizes = [g.shape.num_elements() * g.dtype.size for g in first]
    summed = [[None] * len(first) for _ in devices]
    for bucket in buckets(sizes, backward_order(first), bucket_kb * 1024):
        with tf.name_scope("bucket"):
            out = reduce([[per_device[i] for i in bucket] for per_device in grads], devices)
        for d, per_device in enumerate(out):
            for i, g in zip(bucket, per_device):
                summed[d][i] = g
    return summed
