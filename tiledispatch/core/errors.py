"""The exceptions of tiledispatch: one root, one subclass per kind of mistake.

Every error message says what is wrong and what would work instead, so that a
user can fix the call without reading our source.
"""


class TiledispatchError(Exception):
    """Root of every error tiledispatch raises on purpose."""


class InvalidProblemError(TiledispatchError, ValueError):
    """The operation asked for is malformed: shapes, dtypes, devices or strides disagree."""


class UnsupportedError(TiledispatchError):
    """The operation is well formed but nothing here can run it (dtype on this arch, layout, ...)."""


class InvalidConfigError(TiledispatchError, ValueError):
    """A kernel config breaks a validation rule; the message names the rule."""


class UnknownKernelError(TiledispatchError, KeyError):
    """A kernel name that the registry does not hold."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class NoKernelError(TiledispatchError):
    """No candidate of the registry supports a problem."""


class RegistryFormatError(TiledispatchError, ValueError):
    """A registry file that is not a valid tiledispatch registry."""


class CacheError(TiledispatchError):
    """The on-disk kernel cache cannot be used as asked."""


class InsecureCacheError(CacheError):
    """The cache directory is writable by other users, so its artifacts cannot be trusted."""


class BuildError(TiledispatchError):
    """Compiling a kernel failed."""


class ArchError(TiledispatchError):
    """An unknown architecture name, or facts about one that cannot be read."""


class InvalidArgumentError(InvalidProblemError, TypeError):
    """An argument of the wrong type or out of range; the message names the argument."""
