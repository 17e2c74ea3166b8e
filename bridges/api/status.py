"""gsim's errors as gRPC status codes for every service `gsim serve` answers (gsim's own API and AlpaSim's
sensorsim): the `rpc` wrapper of a handler, and request parsers that let it answer INVALID_ARGUMENT for bytes that
are not its request message."""
from __future__ import annotations

import functools
import logging
import secrets

import grpc

from gsim.errors import GsimError, InputError, NotFound, Unavailable

from .wire import WireError

REQUEST_ID_KEY = "gsim-request-id"  # trailing metadata of an INTERNAL status: the id its logged traceback is under
log = logging.getLogger("gsim.bridges.api.server")  # (the documented logger of the server's bugs)
# An error message's length at most: it travels percent-encoded (up to 12 bytes a character) in the trailing
# metadata, which clients refuse beyond 16 KiB (they would see RESOURCE_EXHAUSTED instead of the status).
MAX_DETAILS_CHARS = 1000


class Precondition(GsimError, RuntimeError):
    """A call that the state of its session refuses (stepping a run that is over)."""


class ShuttingDown(Unavailable):
    """The server is stopping: UNAVAILABLE (another server, or this one restarted, may answer)."""


class Unimplemented(GsimError):
    """A request for something this server does not serve (an image format, a camera model): UNIMPLEMENTED."""


class Undecodable:
    """What a request's bytes became when they do not parse as its message: the handler answers
    INVALID_ARGUMENT with ``why`` (gRPC itself would answer INTERNAL, "Exception deserializing request!")."""

    def __init__(self, why: str):
        self.why = why


def request_parser(message_class):
    def parse(data: bytes):
        try:
            return message_class.FromString(data)
        except Exception as e:  # DecodeError: truncated, a wrong wire type, a string that is not UTF-8, ...
            return Undecodable(f"request: {len(data)} bytes that are not a {message_class.DESCRIPTOR.full_name} "
                                f"message ({type(e).__name__}: {e})")
    return parse


# gsim's deliberate errors (`gsim.errors`) and the status each gets; the first match wins (subclasses first)
STATUS_OF = ((Unimplemented, grpc.StatusCode.UNIMPLEMENTED),
             (NotFound, grpc.StatusCode.NOT_FOUND),  # an unknown scene, session, camera, LiDAR, actor
             (InputError, grpc.StatusCode.INVALID_ARGUMENT),  # a bad request field (WireError, ActionError, ...)
             (Precondition, grpc.StatusCode.FAILED_PRECONDITION),  # a session's run is over
             (ShuttingDown, grpc.StatusCode.UNAVAILABLE),
             (Unavailable, grpc.StatusCode.FAILED_PRECONDITION),  # this server lacks a backend, extra or program
             (GsimError, grpc.StatusCode.ABORTED))  # a closed-loop run that cannot go on (LoopError, SumoError, ...)


def rpc(method):
    """Maps gsim's deliberate errors to status codes (`STATUS_OF`); anything else is a bug in gsim: INTERNAL,
    with its traceback logged under a fresh request id that the status carries (details and trailing metadata
    ``gsim-request-id``), so that the bug's report can quote it."""
    @functools.wraps(method)
    def wrapped(self, request, context):
        try:
            if isinstance(request, Undecodable):
                raise WireError(request.why)
            return method(self, request, context)
        except Capacity as e:
            code, msg = grpc.StatusCode.RESOURCE_EXHAUSTED, str(e)
        except Stopped as e:
            code, msg = e.code, str(e)
        except GsimError as e:
            code, msg = next(c for cls, c in STATUS_OF if isinstance(e, cls)), str(e)
        except Exception as e:  # a bug in gsim, not the caller's
            rid = secrets.token_hex(8)
            log.exception("request %s: %s failed (a bug in gsim)", rid, method.__name__)
            context.set_trailing_metadata(((REQUEST_ID_KEY, rid),))
            code, msg = grpc.StatusCode.INTERNAL, (f"internal error in gsim ({type(e).__name__}; request id {rid}: "
                                                   f"the server's log has its traceback): please report it")
        if len(msg) > MAX_DETAILS_CHARS:  # (messages quote request fields, which may be megabytes long)
            msg = msg[:MAX_DETAILS_CHARS] + f"... ({len(msg) - MAX_DETAILS_CHARS} more characters)"
        context.abort(code, msg)
    return wrapped


class Capacity(RuntimeError):
    """Calls or sessions beyond the server's limits: RESOURCE_EXHAUSTED (retry later)."""


class Stopped(RuntimeError):
    def __init__(self, code, msg):
        super().__init__(msg)
        self.code = code
