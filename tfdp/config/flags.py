"""The command line of ``tfdp.train``, made from :class:`tfdp.config.settings.Config`'s fields.

Each field of ``Config`` is a flag with the field's name, default and help (written there
only). This is the only module that reads ``absl.flags.FLAGS``: ``config_from_flags`` turns the
parsed flags into a validated ``Config``, and nothing below ``train.py`` sees a flag. The
launcher and the benchmark forward these same flags to ``tfdp.train`` unchanged.

``python -m tfdp.config.flags > docs/flags.md`` writes the flags' table from the same fields (a test
checks that the committed page is current).
"""

import dataclasses
import os
import re
import sys
import typing

from absl import flags

from tfdp.config.settings import Config, help_of

FLAGS = flags.FLAGS

_DEFINE = {bool: flags.DEFINE_boolean, int: flags.DEFINE_integer, float: flags.DEFINE_float,
           str: flags.DEFINE_string}


def define_flags(flag_values=FLAGS) -> None:
    """Define one flag per ``Config`` field in ``flag_values`` (absl's global ones by default;
    idempotent, so tests and the bench may call it)."""
    for field in dataclasses.fields(Config):
        if field.name in flag_values:
            continue
        kind = field.type
        if typing.get_origin(kind) is typing.Union:  # Optional[X]: X, with None as default.
            kind = next(a for a in typing.get_args(kind) if a is not type(None))
        _DEFINE[kind](field.name, field.default, help_of(field), flag_values=flag_values)


HELP_ARGS = ("-h", "--help", "-help", "--helpshort")


def help_parser(program: str, doc: str, modules: list = None, parse=None):
    """A ``flags_parser`` for ``absl.app.run``: ``--help`` prints ``doc`` and the flags the
    named ``modules`` define (default: the ``__main__`` module's), and exits 0; anything else
    goes to ``parse`` (default: absl's flags), and a flag it refuses ends ``program`` in one
    line (``absl.flags.Error``: unknown, or a value of the wrong type), exit 2. absl's own
    ``--help`` exits 1 and lists only ``__main__``'s flags (tfdp's live in other modules: "Try
    --helpfull"); ``--helpfull`` still shows absl's too."""

    def parser(argv):
        own = argv[1:argv.index("--")] if "--" in argv else argv[1:]  # After it: another's.
        if not any(arg in HELP_ARGS for arg in own):
            try:
                return parse(argv) if parse else FLAGS(argv)
            except flags.Error as e:
                text = re.sub(r"^Unknown command line flag '(.*?)'", r"unknown flag --\1", str(e))
                text = re.sub(r"\. Did you mean: (.*?) \?$", r" (did you mean --\1?)", text)
                print(f"{program}: error: {text}; see {program} --help", file=sys.stderr)
                sys.exit(2)
        try:
            print(doc.strip().replace("``", ""))
            print()
            for text in ([FLAGS.module_help(m) for m in modules] if modules
                         else [FLAGS.main_module_help()]):
                print(text)
            sys.stdout.flush()
        except BrokenPipeError:  # `--help | head`: the reader has all it wants.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)

    return parser


def config_from_flags(flag_values=FLAGS) -> Config:
    """Build the validated run configuration from the parsed flags."""
    return Config(**{field.name: flag_values[field.name].value
                     for field in dataclasses.fields(Config)})


def config_from_args(args: list) -> Config:
    """The validated ``Config`` that ``tfdp.train`` would run with the arguments ``args``
    (its one-line ``UserError``, or ``absl.flags.Error`` for a flag it does not know), parsed
    apart from absl's global flags: the benchmark checks its commands before running any."""
    values = flags.FlagValues()
    define_flags(values)
    values(["tfdp.train", *args])
    return config_from_flags(values)


# The flags a tfdp.server shares with the tfdp.train client it serves: its devices and its data.
SHARED_WITH_SERVERS = ("num_gpus", "dataset", "image_size", "validation_split", "seed",
                       "data_dir", "manual_dir", "collective_timeout", "verbose")


def server_args(config: Config) -> list:
    """The command line of a ``tfdp.server`` serving ``config``'s client: the shared flags that
    ``config`` sets to other than their defaults (the server keeps its own otherwise)."""
    defaults = {field.name: field.default for field in dataclasses.fields(Config)}
    args = []
    for name in SHARED_WITH_SERVERS:
        value = getattr(config, name)
        if value != defaults[name]:
            args.append(f"--{name}" if value is True else f"--{name}={value}")
    return args


def markdown() -> str:
    """docs/flags.md: every flag of ``tfdp.train`` (and keyword of ``tfdp.run``), its default
    and its help, from ``Config``."""
    lines = ["# Flags of `python -m tfdp.train` (and keywords of `tfdp.run`)", "",
             "Written by `python -m tfdp.config.flags > docs/flags.md` from `tfdp/config/settings.py`; "
             "`python -m tfdp.train --help` prints the same.", "",
             "| flag | default | meaning |", "| --- | --- | --- |"]
    for field in dataclasses.fields(Config):
        default = "none" if field.default is None else f"`{field.default}`"
        text = help_of(field).replace("|", "\\|")
        lines.append(f"| `--{field.name}` | {default} | {text} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
