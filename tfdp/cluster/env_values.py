"""Values a cluster manager (Slurm, a Kubernetes Indexed Job) puts in a task's environment,
read checked: a value missing, not a number or out of range is one line naming the variable,
before anything waits on it. A port of 99999 or 0 otherwise reaches TensorFlow, whose workers
then wait for peers that can never answer until ``--collective_timeout``."""

import re

from tfdp.cluster.tf_config import MAX_PORT
from tfdp.util.errors import UserError

# DNS labels (RFC 1123) joined by dots: a Kubernetes Service's name, or its longer forms.
_LABEL = r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?"
_DNS_NAME = re.compile(rf"{_LABEL}(\.{_LABEL})*")


def require(env, names, where: str, remedy: str) -> None:
    """Refuse ``where`` (e.g. "a Slurm job step") without each of ``names`` set, naming all
    that are missing."""
    missing = [name for name in names if not env.get(name)]
    if missing:
        raise UserError(f"{where} without {', '.join(missing)}: {remedy}")


def integer(env, name: str, low: int = None, high: int = None, default: int = None) -> int:
    """``env[name]`` as an integer within ``low..high`` (``default`` when unset or empty)."""
    raw = env.get(name, "")
    if raw.strip() == "" and default is not None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise UserError(f"{name}={raw!r} is not a whole number") from None
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = (f"{low}..{high}" if low is not None and high is not None else
                  f"at least {low}" if low is not None else f"at most {high}")
        raise UserError(f"{name}={value} is out of range: it must be {bounds}")
    return value


def port(env, name: str, default: int = None) -> int:
    """``env[name]`` as a TCP port a server can listen on (1..65535)."""
    return integer(env, name, 1, MAX_PORT, default)


def dns_name(env, name: str) -> str:
    """``env[name]``, a DNS name: labels of lower-case letters, digits and '-' (at most 63
    each), joined by dots."""
    value = env.get(name, "")
    if not _DNS_NAME.fullmatch(value) or len(value) > 253:
        raise UserError(f"{name}={value!r} is not a DNS name (labels of lower-case letters, "
                        "digits and '-', joined by dots)")
    return value
