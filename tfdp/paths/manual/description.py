"""``--strategy=manual`` as the registry knows it (``tfdp.paths``), without TensorFlow:
the from-scratch loop, its own allreduce and its own flags."""

from tfdp.paths import CLIENT, OwnFlag, Path, register
from tfdp.paths.manual import algorithms
from tfdp.util.errors import UserError

ITS_ALLREDUCE = "its own allreduce"
TENSORFLOWS_WAY = "exchanges gradients in TensorFlow's own collectives"
# The manual path's default --sync_every: the smallest N whose loop passed its bare compiled
# step's rate at batch 32 in both runs of the cadence table (docs/section-12.2.md).
DEFAULT_SYNC_EVERY = 16


def check(config) -> None:
    if config.sync_batch_norm:
        raise UserError("--sync_batch_norm is the Keras paths': the from-scratch step "
                        "normalizes each replica's shard and keeps one set of running "
                        "statistics, their mean")
    if config.model == "lenet_bn" and config.accumulate_steps > 1:
        raise UserError(f"--accumulate_steps={config.accumulate_steps} with lenet_bn: the "
                        "from-scratch step moves batch normalization's statistics once an "
                        "update; use --batch_size instead, or a Keras strategy")


register(Path(
    name="manual",
    summary="the from-scratch data-parallel loop (on the devices of tfdp.server workers when "
            "TF_CONFIG names them)",
    trainer="tfdp.paths.manual.trainer:FromScratchPath",
    cluster=CLIENT,
    regroups=True,
    program="tfdp.train --strategy=manual (the client; its workers run python -m tfdp.server)",
    own_flags={
        "allreduce": OwnFlag((algorithms.DEFAULT,), ITS_ALLREDUCE, TENSORFLOWS_WAY,
                             help=algorithms.help_text, choices=algorithms.NAMES),
        "allreduce_dtype": OwnFlag(
            ("float32",), f"the dtype of {ITS_ALLREDUCE}", "sums in float32",
            help="the dtype the gradients travel and are summed in, cast back before the "
                 "update: float32 (the gradients' own: float64 under --precision=float64), or "
                 "bfloat16 (bf16: half the bytes on every link).",
            choices=("float32", "bfloat16")),
        "bucket_kb": OwnFlag(
            (None,), f"the buckets of {ITS_ALLREDUCE}", TENSORFLOWS_WAY,
            help="pack the gradients into buckets of at most this many KB, in the order the "
                 "backward pass produces them, one allreduce per bucket, so the exchange "
                 "overlaps the backward pass (the ring otherwise waits for every gradient; "
                 "section 12.3). Default: no buckets."),
        "overlap": OwnFlag(
            ("auto",), f"when {ITS_ALLREDUCE} starts", TENSORFLOWS_WAY,
            help="auto lets each allreduce start once its gradients exist; none holds every "
                 "allreduce until the whole backward pass is done (the barrier overlap is "
                 "measured against).",
            choices=("auto", "none")),
        "sync_every": OwnFlag(
            (None, 1), "steps per compiled call of its own loop", "takes one step per call",
            help="training steps per compiled call; the host reads their losses, accuracy and "
                 "finiteness together, once per call (section 12.2: each read is a barrier). "
                 f"Default: {DEFAULT_SYNC_EVERY} (measured in docs/section-12.2.md); 1 reads "
                 "every step. Progress moves, and a SIGTERM is honoured, between calls."),
    },
    refuses={"steps_per_execution": "the manual path's own compiled loop takes --sync_every "
                                    "steps per call"},
    defaults={"init": "textbook", "sync_every": DEFAULT_SYNC_EVERY},
    check=check,
))
