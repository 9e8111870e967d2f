"""Every training path (``--strategy``), described by what it is, read without TensorFlow.

A path declares itself once, in a module of its own package that imports no TensorFlow
(``tfdp/paths/manual/description.py``, ``tfdp/paths/keras/description.py``,
``tfdp/paths/parameter_server/description.py``), by calling ``register(Path(...))``: its name, its
line in ``--help``, the ``TrainingPath`` class that trains it (imported only when a run starts),
how its processes make a cluster, the flags that are its own, its refusals and defaults, and
what a recipe leaves out on it. The flags and their checks, ``--help``, ``tfdp.run``, the
launcher, Slurm's and Kubernetes' clusters, the run skeleton and the bench ask here; none of
them names a strategy.

A path of your own: a module that calls ``register``, named in ``$TFDP_PATHS`` (modules,
comma-separated; the launcher's processes inherit it) or imported before the run.
"""

import dataclasses
import importlib
import os
from typing import Callable, Mapping, Optional

from tfdp.util.errors import UserError

PATHS_ENV = "TFDP_PATHS"
BUILT_IN = ("tfdp.paths.manual.description", "tfdp.paths.keras.description",
            "tfdp.paths.parameter_server.description")

# How a path's processes make a cluster (``Path.cluster``).
NO_CLUSTER = "none"        # one process on its own devices; a cluster of tasks is not its
WORKERS = "workers"        # every task runs tfdp.train and trains a replica; worker 0 is chief
CLIENT = "client"          # one tfdp.train client (the chief) drives tfdp.server tasks

# The strategies a Keras fit path can train under (``Path.keras_strategy``): replicas in sync on
# this process's devices, on every worker's, or Keras' default strategy (one device, none).
MIRRORED, MULTI_WORKER_MIRRORED, KERAS_DEFAULT = ("MirroredStrategy",
                                                  "MultiWorkerMirroredStrategy", "default")


@dataclasses.dataclass(frozen=True)
class OwnFlag:
    """A flag only some paths take: ``off`` the values that leave it unused (any path takes
    those; the first is its default), ``what`` what it is on its owner, ``elsewhere`` what the
    other paths do instead, ``help`` its line in ``--help`` (or a function writing it), and
    ``choices`` the values it takes where it is a choice."""
    off: tuple
    what: str
    elsewhere: str
    help: object = ""
    choices: tuple = ()


@dataclasses.dataclass(frozen=True)
class Path:
    name: str                   # the --strategy value
    summary: str                # its line in --help
    # Its tfdp.training.path_contract.TrainingPath: "module:Class", or a function returning it.
    trainer: object
    cluster: str = NO_CLUSTER   # NO_CLUSTER, WORKERS or CLIENT
    # What tfdp.train is in this path's cluster, as TF_CONFIG's refusals of a task name it.
    program: str = "tfdp.train"
    parameter_servers: bool = False     # its cluster has ps tasks (--num_ps)
    restart_lost_workers: bool = False  # the launcher restarts a worker that died
    # tfdp.launch re-forms its cluster without a lost worker, from the newest backup
    # (--num_workers=MIN:MAX, --max_restarts: tfdp.launcher.elastic)
    regroups: bool = False
    # The tf.distribute strategy a Keras fit path trains under (KERAS_STRATEGIES), or "".
    keras_strategy: str = ""
    # What tfdp.bench's path:k counts: devices of one process, or launched workers.
    scales_by: str = "devices"
    models: tuple = ("lenet", "lenet_bn", "resnet18")
    models_note: str = ""       # why it trains only those
    own_flags: Mapping[str, OwnFlag] = dataclasses.field(default_factory=dict)
    # flag -> why this path refuses another path's flag (instead of its owner's ``elsewhere``).
    refuses: Mapping[str, str] = dataclasses.field(default_factory=dict)
    # Config properties' values where its flag is unset: "init", "sync_every".
    defaults: Mapping[str, object] = dataclasses.field(default_factory=dict)
    # The recipe choices this path takes other values of, by recipe ({recipe: {choice: value}}),
    # and why (one line).
    recipe_overrides: Mapping[str, Mapping[str, object]] = dataclasses.field(default_factory=dict)
    recipe_note: str = ""
    check: Optional[Callable] = None   # check(config): its own refusals, UserError

    def training_path(self):
        """The ``TrainingPath`` subclass that trains this path (imports TensorFlow)."""
        if callable(self.trainer):
            return self.trainer()
        module, _, name = self.trainer.partition(":")
        return getattr(importlib.import_module(module), name)


_REGISTERED: dict = {}
_LOADED: set = set()


def register(path: Path) -> Path:
    """Add ``path`` (its name must be new, or the same description again)."""
    known = _REGISTERED.get(path.name)
    if known is not None and known != path:
        raise ValueError(f"--strategy={path.name} is registered already (by {known.trainer})")
    _REGISTERED[path.name] = path
    return path


def unregister(name: str) -> None:
    """Forget a path (tests register toy paths for a while)."""
    _REGISTERED.pop(name, None)


def _load() -> None:
    """Import the built-in paths' descriptions and those ``$TFDP_PATHS`` names, once each."""
    extra = [m.strip() for m in os.environ.get(PATHS_ENV, "").split(",") if m.strip()]
    if not _LOADED.issuperset(BUILT_IN):
        for module in BUILT_IN:
            importlib.import_module(module)
            _LOADED.add(module)
        # The built-in paths first, whichever registered before them.
        ordered = sorted(_REGISTERED.values(), key=lambda p: not str(p.trainer).startswith(
            "tfdp.paths."))
        _REGISTERED.clear()
        _REGISTERED.update({p.name: p for p in ordered})
    for module in extra:
        if module not in _LOADED:
            try:
                importlib.import_module(module)
            except ImportError as e:
                raise UserError(f"${PATHS_ENV} names {module}, which cannot be imported "
                                f"({e})") from None
            _LOADED.add(module)


def names() -> tuple:
    """Every registered --strategy, the built-in ones first."""
    _load()
    return tuple(_REGISTERED)


def get(name: str) -> Path:
    """The path ``--strategy=name`` chooses; a one-line error when there is none."""
    _load()
    if name not in _REGISTERED:
        raise UserError(f"--strategy={name} is not one of: {', '.join(_REGISTERED)}")
    return _REGISTERED[name]


def all_paths() -> list:
    _load()
    return list(_REGISTERED.values())


def help_text() -> str:
    """``--strategy``'s help: each path's line (written before any flag is read: a module
    ``$TFDP_PATHS`` names that fails to import is said here, and refused when a run starts)."""
    try:
        _load()
        problem = ""
    except UserError as e:
        problem = f" ({e})"
    return "; ".join(f"{p.name}: {p.summary}" for p in _REGISTERED.values()) + "." + problem


def owner_of(flag: str) -> tuple:
    """(the path, its ``OwnFlag``) of a path-owned flag. Written into ``--help`` before any flag
    is read: a module ``$TFDP_PATHS`` names that fails to import is said in ``--strategy``'s
    help and refused when a run starts, not here."""
    try:
        _load()
    except UserError:
        pass
    for path in _REGISTERED.values():
        if flag in path.own_flags:
            return path, path.own_flags[flag]
    raise KeyError(flag)


def own_help(flag: str):
    """A function writing a path-owned flag's help, when ``--help`` asks (``Config``'s fields
    take it): its owner's name, then the owner's text."""
    def text() -> str:
        path, own = owner_of(flag)
        written = own.help() if callable(own.help) else own.help
        return f"{path.name} only: {written}"
    return text


def check_flags_owned(config) -> None:
    """Refuse, in one line, another path's flag set on this one."""
    path = get(config.strategy)
    for owner in all_paths():
        for flag, own in owner.own_flags.items():
            value = getattr(config, flag)
            if flag in path.own_flags or value in own.off:
                continue
            shown = f"--{flag}" if value is True else f"--{flag}={value}"
            why = path.refuses.get(flag, f"--strategy={config.strategy} {own.elsewhere}")
            raise UserError(f"{shown} is --strategy={owner.name}'s ({own.what}): {why}")


def either(names: list) -> str:
    """``a``, ``a or b``, ``a, b or c``."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
