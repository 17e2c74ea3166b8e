"""Exception and warning types shared by gsim's modules (a leaf module: it imports nothing of gsim)."""


class SceneFormatError(ValueError):
    """A scene directory or file that cannot be read; the message names the file and field."""


class GsimWarning(UserWarning):
    """Something legitimate but probably unintended (the CLI prints it as one line)."""
