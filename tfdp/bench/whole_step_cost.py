"""What a ``multi_worker`` worker of an elastic group does more each step, when nothing is lost:
the marks and the copy by which a survivor knows which step it holds whole
(``tfdp.paths.keras.whole_step``), made only where the launcher re-forms the group.

  python -m tfdp.bench.whole_step_cost --rounds=15 --steps=60 --batch_size=256 --model=lenet

Two copies of one Keras model under ``MirroredStrategy`` on two logical CPU devices in this
process, one with the marks, each fitted ``--steps`` steps of random images per round, the
order alternating by round; the CPU time of each fit (``time.process_time``: every thread of the
process, and not the time the machine gave others) per example. The medians' ratio, and the
median and range of the rounds' ratios, printed as one JSON line. CPU, not examples per second: a 2-core
virtual machine's wall clock spreads by tenths between runs of the same work, which hides a cost
of a few percent (docs/benchmarks.md). ``tfdp.bench --elastic`` runs it beside its launches.
"""

import argparse
import json
import statistics
import time


def measure(rounds: int, steps: int, batch: int, model: str) -> dict:
    """CPU-microseconds an example with and without the marks (medians) and their ratio; the
    median and range of the rounds' ratios."""
    from tfdp.util.devices import configure_devices

    devices = configure_devices(2)
    import keras
    import numpy as np
    import tensorflow as tf

    from tfdp.models import catalog
    from tfdp.paths.keras.train_step import global_batch_model
    from tfdp.paths.keras.whole_step import WholeStep

    strategy = tf.distribute.MirroredStrategy(devices)
    rng = np.random.default_rng(0)
    examples = steps * batch
    data = tf.data.Dataset.from_tensor_slices((
        rng.normal(size=[examples, 28, 28, 1]).astype(np.float32),
        rng.integers(0, 10, examples), np.full([examples], 1 / batch, np.float32))
    ).batch(batch).cache()

    def compiled(marked: bool):
        with strategy.scope():
            built = global_batch_model(catalog.build(model, (28, 28, 1), 10, "float32", False,
                                                     seed=1), 1, True, 0.0)
            built.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
                          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                          metrics=["accuracy"])
            built.optimizer.build(built.trainable_variables)
            if marked:
                built.whole_step = WholeStep(built, strategy)
                built.whole_step.start_at(0)
        built.fit(data.take(2), epochs=1, verbose=0, shuffle=False)  # Traced before timing.
        return built

    models = {marked: compiled(marked) for marked in (False, True)}
    cost = {False: [], True: []}
    for round_ in range(rounds):
        for marked in (False, True)[::-1 if round_ % 2 else 1]:
            began = time.process_time()
            models[marked].fit(data, epochs=1, verbose=0, shuffle=False)
            cost[marked].append(1e6 * (time.process_time() - began) / examples)
    ratios = [m / p for p, m in zip(cost[False], cost[True])]
    plain, marked = statistics.median(cost[False]), statistics.median(cost[True])
    return {"model": model, "rounds": rounds, "steps": steps, "batch_size": batch,
            "plain_us": plain, "marked_us": marked, "medians_ratio": marked / plain,
            "ratio": statistics.median(ratios), "ratio_range": [min(ratios), max(ratios)]}


def main(argv=None) -> None:
    # argparse, not absl's flags: tfdp.bench's own flags have these names in the same package.
    parser = argparse.ArgumentParser(prog="python -m tfdp.bench.whole_step_cost")
    parser.add_argument("--rounds", type=int, default=15, help="rounds, each fitting both once")
    parser.add_argument("--steps", type=int, default=60, help="steps a fit")
    parser.add_argument("--batch_size", type=int, default=256, help="global batch")
    parser.add_argument("--model", default="lenet", help="a built-in model (tfdp.models.catalog)")
    args = parser.parse_args(argv)
    print(json.dumps(measure(args.rounds, args.steps, args.batch_size, args.model)))


if __name__ == "__main__":
    main()
