"""``--strategy=manual``: the from-scratch path, on this machine's devices or on a cluster's.

``FromScratchPath`` (a ``TrainingPath``) sets up the devices (``tfdp.util.devices``, or the
workers of ``tfdp.server``s: ``tfdp.paths.manual.remote``) and the model (``tfdp.models.stateless``:
the hand-written LeNet, or any Keras model); ``train`` copies the model's parameters onto every
device, makes the step (``tfdp.paths.manual.step``) and runs the shared epoch loop
(``tfdp.training.loop``) with it; ``serving_model`` puts the trained parameters into a Keras
model for the export. The run skeleton (``tfdp.training.lifecycle``) does the rest.
"""

import tensorflow as tf

from tfdp.cluster.stall import PEER_LOST, clear_a_lost_peers_errors, read_after_a_loss, watching
from tfdp.config.plan import global_batch_size
from tfdp.data import pipeline
from tfdp.models import stateless
from tfdp.paths.manual import remote
from tfdp.paths.manual.evaluation import make_eval_step
from tfdp.paths.manual.feed import EVAL, TEST, TRAIN, Feed, local_feed
from tfdp.paths.manual.replicate import Replicas
from tfdp.paths.manual.step import StepSettings, make_train_step
from tfdp.paths.manual.window import make_train_window
from tfdp.trace.arrivals import Arrivals
from tfdp.training import loop
from tfdp.training.path_contract import TrainingPath
from tfdp.training.state import TrainingState
from tfdp.training.survivors import keep_survivors_step
from tfdp.util.devices import configure_devices
from tfdp.util.errors import UserError


class FromScratchPath(TrainingPath):
    """The devices to train on: here, or a cluster's workers when ``TF_CONFIG`` names them."""

    def __init__(self, resolved, backups):
        config = self.config = resolved.config
        task = remote.task_of(config.collective_timeout)
        self.cluster = remote.connect(task, config, backups.steps) if task else None
        if self.cluster:
            self.devices, where = self.cluster.devices, self.cluster.describe()
            self.stall, self.peers = self.cluster.stall, self.cluster.stall.peers
            self.servers_traced = self.peers  # They run the step, but no loop to trace it.
            self.examples = (self.cluster.examples[TRAIN], self.cluster.examples[EVAL])
            self.dataset = self.cluster.dataset
        else:
            self.devices = configure_devices(config.num_gpus)
            # A batch too small to split is refused before the data is prepared (minutes).
            global_batch_size(config, len(self.devices))
            self.dataset = pipeline.dataset_of(config)  # After the devices: it may start TensorFlow.
            where = f"{len(self.devices)} device(s) {self.devices}"
        self.replicas = len(self.devices)
        # The flight recorder: what the one-line error of a lost cluster points to.
        self.recorder = Arrivals(self.devices, config.workdir)
        if self.cluster:
            self.stall.recorder = self.recorder
            self.recorder.silences = self.stall.silences  # A pause in the exchange, named.
        every = config.steps_between_syncs
        self.engine = (f"{where}, allreduce {config.allreduce}, "
                       f"{'eager' if config.eager else 'compiled'} step, host reads every "
                       + (f"{every} steps" if every > 1 else "step"))
        self.model = stateless.for_the_step(config, self.dataset.image_shape,
                                            self.dataset.num_classes)
        if config.accumulate_steps > 1 and self.model.moving:
            raise UserError(f"--accumulate_steps={config.accumulate_steps} with "
                            f"--model={config.model}: its running statistics (batch "
                            "normalization's) would move once per micro-batch, not once per "
                            "update; train it without accumulation")
        self.weights = None

    def train(self, run, state=None) -> list:
        feed = None
        if self.cluster:
            feed = self.cluster.feed(self.config, run.plan)
            run.watch.listen(self.cluster.preempted_worker)
        start = TrainingState(self.model.initial(), states=self.model.initial_states())
        params = train(run, self.model, state or start, feed, self.recorder,
                       self.cluster.answering if self.cluster else None)
        self.weights = [params[name] for name in self.model.names]
        return self.weights

    def serving_model(self, precision: str):
        return self.model.serving_model(self.weights, precision)


def train(run, model, state: TrainingState, feed: Feed = None,
          arrivals: Arrivals = None, answers=None) -> dict:
    """Train ``model`` (``tfdp.models.stateless``) data-parallel on ``run.devices`` by
    ``run.plan`` from ``run.first_step`` and ``state`` (its weights and seed states, and its
    optimizer's slots and averages where it has them: else the slots' zeros and the averages'
    start); return
    the trained parameters (numpy, by name). The examples come from ``run``'s splits unless a
    ``feed`` says otherwise; ``arrivals`` keeps the replicas' times
    (``tfdp.trace.arrivals``); the parameters returned are the averaged ones under ``--ema``,
    what is evaluated and exported. On a cluster, ``answers()`` names the devices whose
    workers still answer: a run that loses one first saves the newest whole step a surviving
    replica holds (``ReplicaSteps.keep_survivors_step``), then raises."""
    config = run.config
    settings = StepSettings.of(config)
    with watching(run.stall, "placing the replicas"):
        variables = {**dict(zip(model.names, state.weights)),
                     **dict(zip(model.states, state.states or model.initial_states()))}
        replicas = Replicas.place(variables, run.devices, settings.optimizer,
                                  settings.averaging, state.slots, state.averages,
                                  first_step=run.first_step, model=model)
    steps = ReplicaSteps(run, replicas, settings,
                         feed or local_feed(config, run.plan, run.devices, run.train_split,
                                            run.eval_split, run.test_split),
                         arrivals or Arrivals(run.devices, config.workdir))
    try:
        loop.train(run, steps)
    except PEER_LOST:
        if answers is not None:
            steps.keep_survivors_step(answers)
        raise
    return steps.trained()


class ReplicaSteps(loop.Steps):
    """The loop's steps on replicas: ``--sync_every`` steps a call (one compiled window), each
    call's results read before the next is issued."""

    def __init__(self, run, replicas: Replicas, settings: StepSettings, feed: Feed,
                 arrivals: Arrivals):
        self.run, self.replicas, self.feed, self.settings = run, replicas, feed, settings
        self.sync_every = run.config.steps_between_syncs
        self.arrivals, self.collected = arrivals, run.first_step
        self.train_window = make_train_window(make_train_step(replicas, settings, feed),
                                              run.plan, settings.eager)
        self.eval_step = make_eval_step(replicas, settings, feed)
        self.test_step = None  # Made (traced) where the test set is evaluated after training.

    def batches(self, first_epoch, offset):
        return self.feed.train_batches(first_epoch, offset)

    def issue(self, batches, first_step, count):
        return self.train_window(batches, tf.constant(first_step, tf.int64),
                                 tf.constant(count, tf.int32))

    def collect(self, pending):
        losses, correct, examples, times = (t.numpy() for t in pending)
        first = self.collected
        for i, step_times in enumerate(times):
            self.arrivals.add(first + i + 1, step_times)
        self.collected += len(losses)
        return list(zip(losses.tolist(), correct.tolist(), examples.tolist()))

    def epoch_figures(self):
        return self.arrivals.epoch_figures()

    def evaluate(self, final=False):
        plan = self.run.plan
        if not final:
            return loop.mean_over((self.eval_step(*batch) for batch in self.feed.eval_batches()),
                                  plan.eval_examples)
        self.test_step = self.test_step or make_eval_step(self.replicas, self.settings,
                                                          self.feed, TEST)
        return loop.mean_over((self.test_step(*batch) for batch in self.feed.test_batches()),
                              plan.test_examples)

    def trained(self) -> dict:
        """The model trained: replica 0's parameters, averaged under ``--ema``."""
        with watching(self.run.stall, "reading the trained parameters"):
            return {name: var.numpy() for name, var in self.replicas.evaluated()[0].items()}

    def state(self, d: int = 0) -> TrainingState:
        """The live weights, the optimizer's slots, the averages and the seed states (replica
        ``d``'s: every replica's are the same)."""
        model = self.replicas.model
        with watching(self.run.stall, "reading the trained parameters"):
            live, slots = self.replicas.params[d], self.replicas.slots[d]
            kinds = len(next(iter(slots.values()), ()))
            return TrainingState([live[name].numpy() for name in model.names],
                                 [slots[name][k].numpy() for k in range(kinds)
                                  for name in model.trainable],
                                 [v.numpy() for v in self.replicas.averages[d].values()],
                                 [live[name].numpy() for name in model.states])

    def keep_survivors_step(self, answers) -> None:
        """After a loss: back up the newest whole step a replica on a worker that still
        answers holds (``tfdp.training.survivors``); where none holds one, the newest backup
        stays the one to go on from. One line says which."""
        if self.run.backups is None:
            return
        clear_a_lost_peers_errors()
        with watching(self.run.stall, "reading the surviving replicas' step"):
            d, step = self.replicas.survivor(answers())
        keep_survivors_step(self.run, step, lambda: read_after_a_loss(lambda: self.state(d)),
                            "no surviving replica" if d is None else
                            f"the replica on {self.replicas.devices[d]}")
