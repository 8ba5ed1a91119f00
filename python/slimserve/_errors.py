"""The one exception family of the package.

Every failure slimserve raises is a `SlimserveError` with `code`, the status name of the C ABI
("invalid_argument", "out_of_range", "stale_handle", ...), and a message that names the
argument and value at fault (without repeating the code). Two subclasses also derive from the
built-in types Python habit expects, so `except ValueError` / `except TypeError` keep working:

  SlimserveValueError(SlimserveError, ValueError)  a bad value: shape, length, id, scale, stride
  SlimserveTypeError(SlimserveError, TypeError)    a wrong kind of argument: dtype, device, None

Errors of the C library map by status: invalid_argument and out_of_range raise
SlimserveValueError, every other status a plain SlimserveError.
"""
from __future__ import annotations


class SlimserveError(RuntimeError):
    """A failed call: `code` is the status name, `status` its C value, str() the reason."""

    def __init__(self, message: str, code: str = "invalid_argument", status: int = None):
        from . import _capi
        self.code = code
        self.status = status if status is not None else _capi.STATUS_CODES.get(code, -1)
        super().__init__(message)


class SlimserveValueError(SlimserveError, ValueError):
    """A bad value (shape, length, id, scale, stride): also a ValueError."""


class SlimserveTypeError(SlimserveError, TypeError):
    """A wrong kind of argument (dtype, device, a required argument missing): also a TypeError."""


def value_error(message: str, code: str = "invalid_argument") -> SlimserveValueError:
    """A SlimserveValueError (also a ValueError) with `message` and status name `code`."""
    return SlimserveValueError(message, code)


def type_error(message: str) -> SlimserveTypeError:
    """A SlimserveTypeError (also a TypeError) with `message`, status invalid_argument."""
    return SlimserveTypeError(message, "invalid_argument")


def from_status(status: int, message: str) -> SlimserveError:
    """The exception for a C status and its last message, without the "<status name>: " prefix
    the library's message starts with."""
    from . import _capi
    code = _capi.STATUS_NAMES.get(status, "unknown")
    for prefix in (code.replace("_", " ") + ": ", code + ": ", "internal error: "):
        if message.startswith(prefix):
            message = message[len(prefix):]
            break
    cls = SlimserveValueError if code in ("invalid_argument", "out_of_range") else SlimserveError
    return cls(message, code, status)
