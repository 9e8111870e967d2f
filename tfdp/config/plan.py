"""A run's arithmetic, computed once: global batch, per-replica shards, steps per epoch, warmup,
the learning rate of every step, and evaluated examples.

Every path makes its ``Plan`` as soon as it knows how many replicas it has (under
``multi_worker`` only the strategy knows), states it in one log line, trains by it, and
records it in ``metrics.json``.

Shards: a global batch of n examples on k replicas gives shards of n // k, the first n % k one
larger, contiguous and in order (the textbook's ``split_batch``), on every path.

Learning rate across devices: the linear scaling rule with a linear warmup (Goyal et al. 2017,
"Accurate, Large Minibatch SGD"): when the global batch grows k-fold, grow the learning rate
k-fold too, but reach it gradually, because a large rate on a fresh model diverges. The same
formula serves the from-scratch loop (Python numbers) and Keras (tensors).

One-cycle (``--schedule=one_cycle``, Smith and Topin 2017, the triangular schedule of the
CIFAR-10 speedruns): from a tenth of the peak up to the peak over the first
``--one_cycle_rise`` of the run's steps, then linearly down to 0 at its last step; the run's
length is ``--epochs`` (a run stopped early by ``--target_accuracy`` stops partway down).
"""

import dataclasses
from typing import Optional

from tfdp.config.settings import DEFAULT_BATCH_SIZE
from tfdp.util.errors import UserError


@dataclasses.dataclass(frozen=True)
class Plan:
    strategy: str
    replicas: int
    global_batch: int          # examples per update: accumulate_steps micro-batches
    per_replica_batch: tuple   # shard sizes of an update, first replica first
    accumulate_steps: int      # micro-batches per update; every step counted is an update
    micro_batch: int           # the global batch of one micro-batch, and of evaluation
    steps_per_epoch: int
    epochs: int
    base_lr: float
    peak_lr: float
    warmup_steps: int
    schedule: str              # constant (with the warmup above) or one_cycle
    one_cycle_rise: float      # one_cycle: the share of total_steps over which the rate rises
    total_steps: int           # the run's steps: epochs x steps_per_epoch
    train_examples: int        # in the training split
    eval_examples: int         # examples each evaluation after an epoch covers
    split_examples: int        # in the split evaluated after every epoch
    eval_steps: Optional[int]  # cap on evaluation batches (None: the whole split)
    init: str
    precision: str
    optimizer: str = "sgd"     # --optimizer: named in the run's line unless the textbook's
    evaluated: str = "test"    # the split evaluated after every epoch (or "validation")
    tested: int = 0            # test examples evaluated once after training (with validation)

    def learning_rate(self, step: int) -> float:
        """The learning rate of global step ``step`` (``learning_rate``)."""
        if self.schedule == "one_cycle":
            return one_cycle(step, self.peak_lr, self.total_steps, self.one_cycle_rise)
        return learning_rate(step, self.base_lr, self.peak_lr, self.warmup_steps)

    @property
    def eval_note(self) -> str:
        """`` (first 512 of 10000 test examples)`` when evaluation covers part of its split."""
        return covered(self.eval_examples, self.split_examples, self.evaluated)

    @property
    def test_examples(self) -> int:
        """How many test examples the evaluation after training covers (``tested``, capped as
        every evaluation is by ``--eval_steps``)."""
        return eval_examples(self.tested, self.micro_batch, self.eval_steps)

    @property
    def test_note(self) -> str:
        return covered(self.test_examples, self.tested, "test")

    def describe(self, engine: str) -> str:
        """The run's one line: ``engine`` says what runs the replicas (devices, allreduce or
        strategy, compiled or eager)."""
        lr = (f"lr {self.peak_lr:g} after {self.warmup_steps} warmup steps from "
              f"{self.base_lr:g}" if self.warmup_steps else f"lr {self.peak_lr:g}")
        if self.schedule == "one_cycle":
            lr = (f"one-cycle lr {self.peak_lr / 10:g} up to {self.peak_lr:g} at step "
                  f"{one_cycle_peak(self.total_steps, self.one_cycle_rise)}, down to 0 at step "
                  f"{self.total_steps}")
        if self.optimizer != "sgd":
            lr = f"{self.optimizer}, {lr}"
        accumulated = (f", accumulated from {self.accumulate_steps} micro-batches of "
                       f"{self.micro_batch} (steps below are updates)"
                       if self.accumulate_steps > 1 else "")
        return (f"{self.strategy}: {engine}; global batch {self.global_batch} = "
                f"{' + '.join(map(str, self.per_replica_batch))} per replica{accumulated}; "
                f"{self.steps_per_epoch} steps/epoch; {lr}; {self.precision}; "
                f"evaluating {self.eval_examples} of {self.split_examples} {self.evaluated} "
                "examples" + (f" after every epoch, {self.test_examples} of {self.tested} test "
                              "examples once after training" if self.tested else ""))

    def facts(self, config) -> dict:
        """What the run used, for ``metrics.json`` (beside the configuration as given)."""
        return {"config": config.to_dict(), "global_batch": self.global_batch,
                "per_replica_batch": list(self.per_replica_batch), "replicas": self.replicas,
                "accumulate_steps": self.accumulate_steps, "micro_batch": self.micro_batch,
                "steps_per_epoch": self.steps_per_epoch, "warmup_steps": self.warmup_steps,
                "peak_lr": self.peak_lr, "schedule": self.schedule,
                "total_steps": self.total_steps, "eval_examples": self.eval_examples,
                "evaluated": self.evaluated,
                "init": self.init, "precision": self.precision, "optimizer": self.optimizer}


def global_batch_size(config, replicas: int) -> int:
    """The global batch of one update's micro-step for ``replicas`` replicas; refuses one too
    small to split."""
    if config.per_replica_batch_size is not None:
        return config.per_replica_batch_size * replicas
    batch = config.batch_size or DEFAULT_BATCH_SIZE
    if batch < replicas:
        raise UserError(f"--batch_size={batch} is smaller than the {replicas} replicas it is "
                        f"split across: use --batch_size >= {replicas}")
    return batch


def peak_lr(config, replicas: int) -> float:
    """The learning rate after warmup: scaled by the replicas with --scale_lr."""
    return config.lr * replicas if config.scale_lr else config.lr


def make_plan(config, replicas: int, train_examples: int, split_examples: int,
              evaluated: str = "test", tested: int = 0) -> Plan:
    """The plan of ``config`` on ``replicas`` replicas (refuses a batch too small to split),
    evaluating the split ``evaluated`` of ``split_examples`` after every epoch and ``tested``
    test examples once after training."""
    micro = global_batch_size(config, replicas)
    batch = micro * config.accumulate_steps
    if batch > train_examples:
        raise UserError(f"a global batch of {batch} examples is larger than the "
                        f"{train_examples} training examples: give a --batch_size of at most "
                        f"{train_examples}")
    steps = steps_per_epoch(train_examples, batch, config.steps_per_epoch)
    traced = config.traced_steps
    if traced and traced[0] > steps * config.epochs:
        raise UserError(f"--trace_steps={config.trace_steps} starts after the run's last step: "
                        f"it trains steps 1 to {steps * config.epochs} ({config.epochs} epochs "
                        f"of {steps} steps)")
    return Plan(
        strategy=config.strategy, replicas=replicas, global_batch=batch,
        per_replica_batch=tuple(shard_sizes(batch, replicas)),
        accumulate_steps=config.accumulate_steps, micro_batch=micro, steps_per_epoch=steps,
        epochs=config.epochs, base_lr=config.lr, peak_lr=peak_lr(config, replicas),
        warmup_steps=(warmup_steps(config.warmup_epochs, steps)
                      if config.scale_lr and config.schedule == "constant" else 0),
        schedule=config.schedule, one_cycle_rise=config.one_cycle_rise,
        total_steps=steps * config.epochs,
        train_examples=train_examples,
        eval_examples=eval_examples(split_examples, micro, config.eval_steps),
        split_examples=split_examples, eval_steps=config.eval_steps, init=config.initializer,
        precision=config.precision, optimizer=config.optimizer, evaluated=evaluated,
        tested=tested)


def steps_per_epoch(num_examples: int, batch_size: int, cap: Optional[int] = None) -> int:
    """Batches in one epoch: the last short batch counts (never dropped), then the cap."""
    steps = -(-num_examples // batch_size)
    return min(steps, cap) if cap else steps


def eval_examples(num_examples: int, batch_size: int, steps_cap: Optional[int]) -> int:
    """How many of a split's examples ``steps_cap`` evaluation batches cover."""
    return min(num_examples, steps_cap * batch_size) if steps_cap else num_examples


def covered(evaluated: int, examples: int, split: str) -> str:
    """`` (first 512 of 10000 test examples)`` where an evaluation covers part of ``split``."""
    return "" if evaluated >= examples else f" (first {evaluated} of {examples} {split} examples)"


def shard_sizes(n, k: int) -> list:
    """Sizes of ``n`` examples split into ``k`` shards as evenly as possible (first ones +1).

    Works on Python ints and on scalar tensors (a batch size known only at run time).
    """
    base, extra = n // k, n % k
    if isinstance(n, int):
        return [base + (1 if i < extra else 0) for i in range(k)]
    import tensorflow as tf

    return [base + tf.cast(i < extra, n.dtype) for i in range(k)]


def warmup_steps(warmup_epochs: float, steps_per_epoch: int) -> int:
    return int(round(warmup_epochs * steps_per_epoch))


def learning_rate(step, base_lr: float, peak_lr: float, warmup: int):
    """``base_lr`` at step 0, rising linearly to ``peak_lr`` at step ``warmup``, then flat."""
    if isinstance(step, int):
        if peak_lr == base_lr or warmup <= 0:
            return peak_lr
        return base_lr + (peak_lr - base_lr) * min(1.0, step / warmup)
    import tensorflow as tf

    if peak_lr == base_lr or warmup <= 0:
        return tf.constant(peak_lr)
    fraction = tf.minimum(1.0, tf.cast(step, tf.float32) / warmup)
    return base_lr + (peak_lr - base_lr) * fraction


def one_cycle_peak(total: int, share: float) -> int:
    """The step at which one-cycle's rate peaks: ``share`` of ``total`` (at least 1)."""
    return max(1, int(round(share * total)))


def one_cycle(step, peak_lr: float, total: int, share: float):
    """One-cycle's rate at ``step`` (a Python int, or a tensor): from ``peak_lr / 10`` up to
    ``peak_lr`` at ``one_cycle_peak(total, share)``, then down to 0 at step ``total``."""
    rise, low = one_cycle_peak(total, share), peak_lr / 10
    fall = max(1, total - rise)
    if isinstance(step, int):
        if step < rise:
            return low + (peak_lr - low) * step / rise
        return peak_lr * max(0.0, (total - step) / fall)
    import tensorflow as tf

    step = tf.cast(step, tf.float32)
    return tf.where(step < rise, low + (peak_lr - low) * step / rise,
                    peak_lr * tf.maximum(0.0, (total - step) / fall))
