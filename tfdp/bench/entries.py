"""The one form of every list of configurations the bench takes (``--configs``, ``--configs``
with ``--hosts``, ``--tta_configs``, ``--cadence_configs``): ``path:count[:option...]`` (for the
cadence table, ``mode:batch[:option...]``), each option a word (``ring``,
``jit``, ``fast``) or a setting (``spe=2``, ``acc=4``). Each table reads its own options from the
``Entry``; what is wrong with an entry is one line naming the flag and the entry."""

import dataclasses

from tfdp.util.errors import UserError


@dataclasses.dataclass(frozen=True)
class Entry:
    text: str          # the entry as given (its name in the tables)
    flag: str          # the flag that gave it, for the error lines
    path: str
    count: int         # devices, or workers
    words: tuple       # the options without "="
    settings: dict     # the options name=value

    def refuse(self, why: str) -> UserError:
        return UserError(f"{self.flag} entry {self.text!r}: {why}")


def parse(text: str, flag: str, known: tuple, expected: str = "") -> Entry:
    """``text`` read as ``path:count[:option...]``, its path one of ``known``; ``expected``:
    what the error line says was expected, if not that form with the paths known."""
    parts = text.strip().split(":")
    if len(parts) < 2 or parts[0] not in known or not parts[1].isdigit() or int(parts[1]) < 1:
        raise UserError(f"{flag} entry {text!r}: " + (
            expected or f"expected path:devices[:option...] with path in {', '.join(known)}"))
    options = parts[2:]
    return Entry(text.strip(), flag, parts[0], int(parts[1]),
                 tuple(o for o in options if "=" not in o),
                 dict(o.partition("=")[::2] for o in options if "=" in o))
