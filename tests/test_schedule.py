"""Batch size and learning rate across devices: per-replica batches and the linear scaling rule."""

import pytest
import tensorflow as tf

from conftest import DEVICES, head
from tfdp import logs, report, schedule
from tfdp.config import Config
from tfdp.manual import trainer


def test_warmup_rises_linearly_to_the_scaled_rate():
    lr = [schedule.learning_rate(step, 0.1, 0.4, warmup=4) for step in range(6)]
    assert lr == pytest.approx([0.1, 0.175, 0.25, 0.325, 0.4, 0.4])
    assert float(schedule.learning_rate(tf.constant(2), 0.1, 0.4, 4)) == pytest.approx(0.25)
    assert schedule.learning_rate(7, 0.1, 0.1, warmup=4) == 0.1  # Nothing to warm up to.
    assert schedule.warmup_steps(0.5, 235) == 118


def test_per_replica_batch_and_scaled_lr_are_used_and_logged(tmp_path, train_split, test_split,
                                                             caplog):
    config = Config(num_gpus=4, per_replica_batch_size=16, lr=0.05, scale_lr=True,
                    warmup_epochs=0.5, epochs=1, steps_per_epoch=8, eval_steps=1,
                    init="glorot", workdir=str(tmp_path))
    reporter = report.Reporter(config.run_dir, config.to_dict(), DEVICES[:4], is_chief=False)
    logs.logger.addHandler(caplog.handler)  # Whether or not tfdp.logs.configure() ran.
    try:
        trainer.train(config, DEVICES[:4], head(train_split, 2000), test_split, reporter)
    finally:
        logs.logger.removeHandler(caplog.handler)
    assert "global batch 64 = 16 + 16 + 16 + 16 per device" in caplog.text
    assert "lr 0.2 after 4 warmup steps from 0.05" in caplog.text
    assert reporter.records[0]["examples_per_sec"] * reporter.records[0]["seconds"] == \
        pytest.approx(8 * 64)
