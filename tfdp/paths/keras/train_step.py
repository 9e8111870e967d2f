"""Keras' training step with the manual path's loss, so uneven and empty shards train right.

Keras (3.15) averages the loss over each replica's shard and divides it by the number of
replicas. That is the mean over the global batch only when every shard has the same size; with
3 replicas and a batch of 256 (86 + 85 + 85), or a short final batch, the examples of smaller
shards weigh more. tfdp's step weights every example's loss by 1 / global batch (the weights
come with the data: ``distributed_input.per_replica_batches``), and the optimizer sums the replicas'
gradients, so each step follows the gradient of the mean loss over the global batch, whatever
the shards: the manual path's arithmetic (``paths/manual/trainer.py``).

A replica whose shard is empty (a final batch smaller than the replica count) runs on one
padding example of weight zero, so it contributes a zero gradient and nothing to the reported
loss and accuracy: an empty batch must never reach a kernel (oneDNN's convolution refuses one),
and skipping the replica with ``tf.cond`` is not possible in ``fit``: synchronised batch
normalization all-reduces inside the forward pass, and TF allows no synchronisation point inside
a conditional (``merge_call`` raises). In a model with batch normalization that padding example does enter the empty
replica's batch statistics (with ``--sync_batch_norm``, the global ones) in that one step.

Gradient accumulation (``--accumulate_steps``, K): the replica's shard is cut into K
micro-batches, run one after the other (each once the previous one's gradients exist, so one
micro-batch's activations live at a time), their gradients summed here and applied once, so the
strategy allreduces once per update. Keras' own ``gradient_accumulation_steps`` fails under a
``tf.distribute`` strategy (keras-team/keras#20582); the test that notices its fix is in
``tests/test_accumulation.py``. Batch normalization's statistics are each micro-batch's.

Arrival times (``stamp_arrivals``, under a strategy): each replica stamps when its step starts
and when its gradients are ready for the exchange (``tfdp.trace.arrivals``), and the step's
logs carry them as ``arrival_times``, a [replicas, 2] matrix in which each replica fills its
own row scaled by the replica count (float32, folded modulo ``arrivals.PERIOD``, as Keras
reduces every log of a step in one collective of one dtype): the mean over replicas that Keras
already takes of every log then holds every replica's times, with no collective of their own.

The model's own losses (``model.losses``: regularizers, ``add_loss``) are added as Keras'
``compute_loss`` adds them, divided by the replica count as Keras scales the whole loss under a
strategy (and by the micro-batches), so the summed gradients count them once per update, in
the loss's dtype (Keras' own adds a float64 regularization loss to its float32 loss and fails).
The training loss reported is the cross-entropy's mean plus them, as ``fit`` reports it.

This overrides ``train_step``, the documented way to change what ``fit`` does in one step; the
rest of ``fit`` (the loop, callbacks, distribution, the optimizer) is Keras'.
"""

import keras
import numpy as np
import tensorflow as tf

from tfdp.config.plan import shard_sizes
from tfdp.models.loss import cross_entropy, own_losses
from tfdp.trace import arrivals
from tfdp.trace.arrivals import stamp_after

ARRIVALS = "arrival_times"  # The log that carries them.


class GlobalBatchModel(keras.Model):
    """A functional model whose ``fit`` steps take ``(images, labels, example_weights)``,
    each update summing the gradients of ``accumulate_steps`` micro-batches."""

    accumulate_steps = 1
    stamp_arrivals = False
    label_smoothing = 0.0
    whole_step = None  # A group that goes on: which step a survivor holds (whole_step.py).

    def train_step(self, data):
        images, labels, weights = data
        if self.whole_step is not None:
            with tf.control_dependencies([self.whole_step.begins()]):  # The forward pass after.
                images = tf.identity(images)
        real = tf.shape(labels)[0]
        k = self.accumulate_steps
        sizes = shard_sizes(real, k)
        variables = self.trainable_variables
        if self.stamp_arrivals:
            anchor = variables[-1].value  # The TensorFlow variable: this replica's copy.
            started = stamp_after(real >= 0, [images], anchor)
            with tf.control_dependencies([started]):  # The forward pass starts after it.
                images = tf.identity(images)
        grads, per_example, logits = None, [], []
        replicas = tf.distribute.get_strategy().num_replicas_in_sync
        for x, y, w, size in zip(*(tf.split(t, tf.stack(sizes), num=k)
                                   for t in (images, labels, weights)), sizes):
            if grads is not None:
                with tf.control_dependencies(grads):  # One micro-batch at a time.
                    x = tf.identity(x)
            x, y, w = _pad_empty_shard(x, y, w, size)
            # Named as the other paths' steps name theirs: the timeline finds any model's
            # forward pass by it (tfdp.trace.timeline), not by the model's name.
            with tf.GradientTape() as tape, tf.name_scope("forward"):
                out = self(x, training=True)
                losses = cross_entropy(out, y, self.label_smoothing)
                loss = tf.reduce_sum(losses * tf.cast(w, losses.dtype))
                own = self.own_loss(loss.dtype)
                loss += own / (replicas * k)
            part = tape.gradient(loss, variables)
            grads = part if grads is None else [a + b for a, b in zip(grads, part)]
            per_example.append(losses[:size])
            logits.append(out[:size])
        if self.stamp_arrivals:
            ready = stamp_after(tf.math.is_finite(loss), grads, anchor)
        self.optimizer.apply_gradients(zip(grads, variables))
        per_example, logits = tf.concat(per_example, 0), tf.concat(logits, 0)
        # The shard's mean loss weighted by its size: the tracker then holds the global mean.
        shard = tf.cast(real, per_example.dtype)
        self._loss_tracker.update_state(
            tf.math.divide_no_nan(tf.reduce_sum(per_example), shard) + own,
            sample_weight=shard)
        logs = self.compute_metrics(images, labels, logits)
        if self.stamp_arrivals:
            logs[ARRIVALS] = _own_row(tf.stack([started, ready]))
        if self.whole_step is not None:  # Keras all-reduces the logs: after the updates.
            logs = self.whole_step.ends(logs)
        return logs

    def own_loss(self, dtype):
        """The sum of the model's own losses of its last call (``model.losses``: kernel, bias
        and activity regularizers, ``add_loss``) in ``dtype``, as Keras' ``compute_loss``
        adds them (0 where it has none)."""
        return own_losses(self.losses, dtype)

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        """Keras' ``compute_loss`` with the model's own losses in the compiled loss's dtype:
        ``fit`` builds its loss state with it once (tfdp's step computes its own loss), and
        Keras' would add a float64 model's float64 regularization to its float32 loss (the
        compiled loss follows ``keras.config.floatx()``, float32 outside ``catalog.build``)."""
        del x, training
        compiled = self._compile_loss(y, y_pred, sample_weight)
        return compiled + self.own_loss(compiled.dtype)

    def get_metrics_result(self):
        """Keras' metrics, and an empty ``arrival_times``: at an epoch's end ``fit`` reports
        these results, synchronised over the replicas, only when their names are the step's
        logs' (``Trainer._get_metrics_result_or_logs``); else it reports the last step's logs,
        whose loss is a mean of the replicas' means, wrong for uneven shards."""
        results = super().get_metrics_result()
        if self.stamp_arrivals:
            results[ARRIVALS] = np.zeros([0, 2], np.float32)
        return results


def _own_row(times):
    """A [replicas, 2] float32 matrix: ``times`` modulo ``arrivals.PERIOD``, times the replica
    count, in this replica's row, zeros elsewhere: their mean over replicas is every replica's
    (folded) times. Float32, as the other logs: Keras reduces them all in one collective."""
    context = tf.distribute.get_replica_context()
    replicas = context.num_replicas_in_sync
    row = tf.one_hot(context.replica_id_in_sync_group, replicas, dtype=tf.float32)
    folded = tf.cast(tf.math.floormod(times, arrivals.PERIOD), tf.float32)
    return row[:, None] * folded[None, :] * replicas


def _pad_empty_shard(images, labels, weights, real):
    """One all-zero example of weight zero when the shard is empty, else the shard unchanged."""
    missing = tf.maximum(1 - real, 0)
    return (tf.pad(images, [[0, missing]] + [[0, 0]] * (len(images.shape) - 1)),
            tf.pad(labels, [[0, missing]]), tf.pad(weights, [[0, missing]]))


def global_batch_model(model: keras.Model, accumulate_steps: int = 1,
                       stamp_arrivals: bool = False,
                       label_smoothing: float = 0.0) -> GlobalBatchModel:
    """The same layers and variables as ``model``, trained with tfdp's step (its loss with
    ``label_smoothing``: ``tfdp.models.loss.cross_entropy``)."""
    trained = GlobalBatchModel(inputs=model.inputs, outputs=model.outputs, name=model.name)
    trained.accumulate_steps, trained.stamp_arrivals = accumulate_steps, stamp_arrivals
    trained.label_smoothing = label_smoothing
    return trained
