"""Exception and warning types shared by gsim's modules (a leaf module: it imports nothing of gsim).

gsim raises a `GsimError` on purpose, at an edge, when the input or the machine is wrong: bad input
(`InputError`), a named thing that does not exist (`NotFound`), a backend, extra or program this machine lacks
(`Unavailable`). Its message names the file, field or thing and the expectation. The CLI prints it as one line
(exit 2) and the network API maps it to a client status; any other exception is a bug in gsim (the CLI says
"internal error", exit 3; the server answers INTERNAL). Each type also derives from the builtin a caller would
expect (ValueError, KeyError, RuntimeError), so ``except ValueError`` keeps working.
"""
import re


class GsimError(Exception):
    """An error gsim raises deliberately; its message is meant for the user."""


class InputError(GsimError, ValueError):
    """A value, file or request field that breaks the expectation the message names."""


class SceneFormatError(InputError):
    """A scene directory or file that cannot be read; the message names the file and field."""


class NotFound(GsimError, KeyError):
    """A named thing (asset, actor, scene, camera, edge) that does not exist."""

    def __str__(self) -> str:  # KeyError's str() is the repr of its argument: show the message itself
        return str(self.args[0]) if self.args else ""


class Unavailable(GsimError, RuntimeError):
    """A backend, optional extra or external program this machine lacks; the message says what to install."""


class MissingExtra(Unavailable, ImportError):
    """An optional extra that is not installed; the message names it (pip install 'gsim[extra]')."""


class Diverged(GsimError, FloatingPointError):
    """A training run whose loss stopped being finite; the message says which checkpoint is the last good one."""


class GsimWarning(UserWarning):
    """Something legitimate but probably unintended (the CLI prints it as one line)."""


# Names that become file or folder names (scenario names, asset ids, actor ids, scene and session ids, run
# names): one path component of safe characters, never `.`/`..`, at most 128 characters. Always a full match.
NAME_PATTERN = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
NAME_RE = re.compile(NAME_PATTERN)


def check_name(name: object, what: str) -> str:
    """``name`` if it is a safe path component (`NAME_PATTERN`, full match), else an `InputError` naming ``what``."""
    if not isinstance(name, str) or NAME_RE.fullmatch(name) is None:
        shown = repr(name) if len(repr(name)) <= 60 else repr(name)[:57] + "..."
        raise InputError(f"{what}: {shown} is not a valid name (expected 1-128 characters of A-Z a-z 0-9 _ . -, "
                         f"not starting with '.' or '-')")
    return name
