"""What can go wrong when a version is downloaded, as exceptions a caller can tell apart."""


class FetchError(RuntimeError):
    """A version could not be downloaded and verified."""


class VersionUnavailableError(FetchError):
    """No server lists the requested version (any more)."""


class IntegrityError(FetchError):
    """The assembled file's BLAKE3 does not match distribution.txt."""
