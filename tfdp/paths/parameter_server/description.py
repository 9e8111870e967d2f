"""``--strategy=parameter_server`` as the registry knows it (``tfdp.paths``), without
TensorFlow: asynchronous SGD on servers, and what it cannot take."""

from tfdp.paths import CLIENT, OwnFlag, Path, register
from tfdp.util.errors import UserError


def check(config) -> None:
    if config.ema:
        raise UserError(f"--ema={config.ema}: the parameter servers' workers each apply their "
                        "own gradients, and no one step moves an average; use --ema=0")
    if config.sync_batch_norm:
        raise UserError("--sync_batch_norm: each step of --strategy=parameter_server runs on "
                        "one worker, with no replicas to synchronize")
    if config.optimizer != "sgd":
        raise UserError(f"--optimizer={config.optimizer}: asynchronous SGD applies each "
                        "worker's gradients on the servers as they come, and keeps no slots "
                        "(moments) there; use --optimizer=sgd, or a synchronous --strategy")
    if config.momentum or config.nesterov:
        raise UserError(f"--momentum={config.momentum}: asynchronous SGD applies each "
                        "worker's gradients to parameters other workers moved since it read "
                        "them, and momentum would carry those stale steps on; use --momentum=0")
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
    if config.jit_compile:
        raise UserError("--jit_compile: the coordinator schedules each step on a worker as a "
                        "remote function, which TensorFlow does not run as an XLA computation "
                        "(\"KernelAndDeviceOp does not support EagerFunctionParams\"); "
                        "--strategy=manual compiles each replica's pass")
    if config.accumulate_steps > 1:
        raise UserError(f"--accumulate_steps={config.accumulate_steps} saves the allreduces "
                        "of synchronous training; parameter servers take each worker's "
                        "gradients as they come, and accumulating them on a worker would "
                        "only make its updates staler: raise --batch_size instead")


register(Path(
    name="parameter_server",
    summary="the from-scratch LeNet on parameter servers, asynchronous SGD on "
            "ParameterServerStrategy (TF_CONFIG with workers and ps tasks: python -m "
            "tfdp.launch --num_ps)",
    trainer="tfdp.paths.parameter_server.trainer:ParameterServerPath",
    cluster=CLIENT,
    program="tfdp.train --strategy=parameter_server (the coordinator; its workers and "
            "parameter servers run python -m tfdp.server)",
    parameter_servers=True,
    restart_lost_workers=True,
    scales_by="workers",
    models=("lenet", "resnet18"),
    models_note="its servers' store holds parameters only, not batch normalization's running "
                "statistics",
    own_flags={"ps_shards": OwnFlag(
        (1,), "its parameters split across servers", "keeps no parameter servers",
        help="split each large parameter (LeNet's W2 and W3) into up to this many shards, each "
             "on another server (at most the ps tasks); 1 keeps them whole.")},
    refuses={
        "sync_every": "the coordinator already runs up to two steps per worker ahead and reads "
                      "each step's result as it arrives",
        "steps_per_execution": "the coordinator schedules one compiled step at a time",
    },
    defaults={"init": "textbook"},
    # Momentum: each worker's update lands on parameters other workers moved since it read
    # them; batch normalization's running statistics: the store holds parameters only.
    recipe_overrides={"fast": {"model": "lenet", "momentum": 0.0, "nesterov": False,
                               "ema": 0.0}},
    recipe_note="asynchronous SGD cannot take them",
    check=check,
))
