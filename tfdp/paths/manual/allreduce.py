"""The allreduce algorithms (``tfdp.paths.manual.algorithms`` declares them): sum per-device gradients so every device holds the total.

Each takes ``grads[d][i]``, gradient i on device d, and returns ``out[d][i]``, the sum over all
devices of gradient i, placed on device d. Placing an op with ``tf.device`` is what moves data:
an op on device A that reads a tensor from device B copies it across.
"""

import contextlib

import tensorflow as tf

from tfdp.config.plan import shard_sizes
from tfdp.paths.manual import algorithms


@contextlib.contextmanager
def on_replica(devices: list, d: int):
    """Ops on device ``d``, named ``replica_<d>/...``: how a timeline of a step
    (``tfdp.trace.timeline``) knows whose lane an op is in, even where devices share threads."""
    with tf.device(devices[d]), tf.name_scope(f"replica_{d}"):
        yield


def add_n_allreduce(grads: list, devices: list) -> list:
    """The textbook's: every gradient travels to the first device, is summed there, and the sum
    is broadcast back. Device 0 receives (k-1) copies of everything and sends (k-1): it is the
    bottleneck as k grows."""
    with on_replica(devices, 0):
        sums = [tf.add_n(list(per_param)) for per_param in zip(*grads)]
    return _broadcast(sums, devices)


def sharded_allreduce(grads: list, devices: list) -> list:
    """Parameter-server style: parameter i is summed on device i mod k, then sent back, so the
    reduction work and traffic are spread over the devices instead of all landing on one."""
    sums = []
    for i, per_param in enumerate(zip(*grads)):
        with on_replica(devices, i % len(devices)):
            sums.append(tf.add_n(list(per_param)))
    return _broadcast(sums, devices)


def ring_allreduce(grads: list, devices: list) -> list:
    """Ring: all gradients are flattened into one vector per device and cut into k chunks.

    Reduce-scatter: in k-1 steps each device passes one chunk to its right neighbour, which adds
    its own; afterwards device d holds the full sum of chunk (d+1) mod k. All-gather: k-1 more
    steps pass the finished chunks around. Each device sends and receives 2(k-1)/k of the data,
    independent of k: the algorithm bandwidth-optimal collectives use.
    """
    k = len(devices)
    if k == 1:
        return [list(grads[0])]
    shapes = [g.shape for g in grads[0]]
    flat, chunks = [], []
    for d in range(k):
        with on_replica(devices, d):
            flat.append(tf.concat([tf.reshape(g, [-1]) for g in grads[d]], axis=0))
    sizes = shard_sizes(int(flat[0].shape[0]), k)
    for d in range(k):
        with on_replica(devices, d):
            chunks.append(tf.split(flat[d], sizes))
    for step in range(k - 1):  # reduce-scatter: device d sends chunk (d - step) to d + 1
        sent = [chunks[d][(d - step) % k] for d in range(k)]
        for d in range(k):
            src, c = (d - 1) % k, (d - 1 - step) % k
            with on_replica(devices, d):
                chunks[d][c] = chunks[d][c] + sent[src]
    for step in range(k - 1):  # all-gather: device d sends its finished chunk (d + 1 - step)
        sent = [chunks[d][(d + 1 - step) % k] for d in range(k)]
        for d in range(k):
            src, c = (d - 1) % k, (d - step) % k
            with on_replica(devices, d):
                chunks[d][c] = tf.identity(sent[src])
    out = []
    for d in range(k):
        with on_replica(devices, d):
            total = tf.concat(chunks[d], axis=0)
            pieces = tf.split(total, [s.num_elements() for s in shapes])
            out.append([tf.reshape(p, s) for p, s in zip(pieces, shapes)])
    return out


# --allreduce's names (``tfdp.paths.manual.algorithms``, read without TensorFlow) -> their code.
ALLREDUCE = {name: globals()[f"{name}_allreduce"] for name in algorithms.NAMES}


def _broadcast(sums: list, devices: list) -> list:
    out = []
    for d in range(len(devices)):
        with on_replica(devices, d):
            out.append([tf.identity(s) for s in sums])
    return out
