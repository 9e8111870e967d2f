"""The checks of ``tfdp.config.Config`` that concern one path or one section each, and the
one-line refusals every check shares (``choice``, ``positive``)."""

from tfdp.errors import UserError

NO_SYNC_EVERY = {
    "plain": "Keras fit's own is --steps_per_execution",
    # See the --steps_per_execution refusal in Config.__post_init__.
    "mirrored": "under tf.distribute Keras' multi-step loop (--steps_per_execution) fails",
    "multi_worker": "under tf.distribute Keras' multi-step loop (--steps_per_execution) fails",
    "parameter_server": "the coordinator already runs up to two steps per worker ahead and "
                        "reads each step's result as it arrives",
}


def choice(flag, value, choices):
    if value not in choices:
        raise UserError(f"--{flag}={value} is not one of: {', '.join(choices)}")


def positive(flag, value):
    if not isinstance(value, int) or value <= 0:
        raise UserError(f"--{flag} must be a positive integer, got {value}")


def check_cadence(config):
    """--sync_every and --accumulate_steps against the path (section 12.2)."""
    if config.sync_every is not None:
        positive("sync_every", config.sync_every)
        if config.sync_every > 1 and config.strategy != "manual":
            raise UserError(f"--sync_every={config.sync_every} is the manual path's: "
                            + NO_SYNC_EVERY[config.strategy])
    positive("accumulate_steps", config.accumulate_steps)
    if config.accumulate_steps > 1 and config.strategy == "parameter_server":
        raise UserError(f"--accumulate_steps={config.accumulate_steps} saves the allreduces "
                        "of synchronous training; parameter servers take each worker's "
                        "gradients as they come, and accumulating them on a worker would "
                        "only make its updates staler: raise --batch_size instead")


def check_parameter_server(config):
    """--ps_shards, and what --strategy=parameter_server cannot do."""
    positive("ps_shards", config.ps_shards)
    if config.strategy != "parameter_server":
        if config.ps_shards != 1:
            raise UserError(f"--ps_shards={config.ps_shards} is --strategy=parameter_server's "
                            f"(--strategy={config.strategy} keeps no parameter servers)")
        return
    if config.model != "lenet" and config.ps_shards > 1:
        raise UserError(f"--ps_shards={config.ps_shards} splits the from-scratch lenet's "
                        f"parameters; --model={config.model}'s Keras layers read whole "
                        "variables: use --ps_shards=1 (its variables are spread round robin)")
    if config.num_gpus != 1:
        raise UserError(f"--num_gpus={config.num_gpus}: under --strategy=parameter_server "
                        "each worker trains on one device; add workers (tfdp.launch "
                        "--num_workers) instead")
    if config.eager:
        raise UserError("--eager: the coordinator of --strategy=parameter_server schedules "
                        "compiled steps only")
    if config.steps_per_execution > 1:
        raise UserError("--steps_per_execution is a Keras option: the parameter-server "
                        "path schedules one compiled step at a time")
