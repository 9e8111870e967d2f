"""Batch size and learning rate across devices: per-replica batches and the linear scaling rule."""

import pytest
import tensorflow as tf

from same_model import head, train_manual
from tfdp.config import plan as schedule
from tfdp.config.plan import make_plan
from tfdp.config.settings import Config


def test_warmup_rises_linearly_to_the_scaled_rate():
    lr = [schedule.learning_rate(step, 0.1, 0.4, warmup=4) for step in range(6)]
    assert lr == pytest.approx([0.1, 0.175, 0.25, 0.325, 0.4, 0.4])
    assert float(schedule.learning_rate(tf.constant(2), 0.1, 0.4, 4)) == pytest.approx(0.25)
    assert schedule.learning_rate(7, 0.1, 0.1, warmup=4) == 0.1  # Nothing to warm up to.
    assert schedule.warmup_steps(0.5, 235) == 118


def test_per_replica_batch_and_scaled_lr_are_planned_and_used(tmp_path, train_split, test_split):
    config = Config(num_gpus=4, per_replica_batch_size=16, lr=0.05, scale_lr=True,
                    warmup_epochs=0.5, epochs=1, steps_per_epoch=8, eval_steps=1,
                    init="glorot", workdir=str(tmp_path))
    plan = make_plan(config, 4, 2000, 10000)
    assert (plan.global_batch, plan.per_replica_batch, plan.steps_per_epoch) == (64, (16,) * 4, 8)
    assert (plan.peak_lr, plan.warmup_steps, plan.eval_examples) == (0.2, 4, 64)
    line = plan.describe("4 device(s)")
    assert "global batch 64 = 16 + 16 + 16 + 16 per replica" in line
    assert "lr 0.2 after 4 warmup steps from 0.05" in line
    _, result = train_manual(config, head(train_split, 2000), test_split)
    assert result.history[0]["examples_per_sec"] * result.history[0]["seconds"] == \
        pytest.approx(8 * 64)
