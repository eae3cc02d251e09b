"""Turn what Google's APIs say into ``PortError`` codes the handlers act on.

Handlers never see google.api_core exceptions: they see a portable code (fail the task,
retry later, adopt, treat as gone) and the API's own words. The words matter: the job
table's Message quotes them, so the text is taken from the response body (REST) or the
status details (gRPC), never from api_core's formatted "POST https://...: ..." string.

The classification is by message as well as by status, because the same condition
arrives differently per transport (reference §1.9): over REST a concurrent-operation
FAILED_PRECONDITION is a plain HTTP 400 ``BadRequest``; an insufficient-quota refusal
is a 403 (REST) or PERMISSION_DENIED / RESOURCE_EXHAUSTED (gRPC); a stockout shows up
only inside a finished operation's ``error`` or the pool's conditions.
"""

from __future__ import annotations

from collections.abc import Iterable

import requests
from google.api_core import exceptions as gexc

from falcon_es.domain.ports import (
    ALREADY_EXISTS,
    FAILED,
    INVALID,
    NOT_FOUND,
    PERMISSION_DENIED,
    QUOTA_EXCEEDED,
    RETRYABLE,
    STOCKOUT,
    PortError,
)

#: Phrases GKE and Compute use when a zone has no capacity for the VMs asked for.
STOCKOUT_MARKERS = (
    "gce_stockout",
    "stockout",
    "does not have enough resources available",
    "zone_resource_pool_exhausted",
    "resource_pool_exhausted",
    "insufficient reserved capacity",
    "currently unavailable in the",
)

#: Phrases of a project or region that is out of quota (not an API rate limit).
QUOTA_MARKERS = (
    "gce_quota_exceeded",
    "quota_exceeded",
    "insufficient regional quota",
    "insufficient quota",
    "quota '",
    'quota "',
    "exceeded quota",
)

#: Phrases of a refusal that goes away by itself: another operation holds the
#: cluster, or the caller hit an API rate limit.
RETRY_MARKERS = (
    "please wait and try again",
    "try again later",
    "incompatible operation",
    "is currently creating",
    "is currently deleting",
    "is currently upgrading",
    "is currently updating",
    "is currently being",
    "another operation",
    "too many operations",
    "concurrent operations quota",
    "quota metric",
    "rate limit",
)

# google.rpc.Code values as they appear in a GKE Operation's ``error.code``.
RPC_INVALID_ARGUMENT = 3
RPC_DEADLINE_EXCEEDED = 4
RPC_NOT_FOUND = 5
RPC_ALREADY_EXISTS = 6
RPC_PERMISSION_DENIED = 7
RPC_RESOURCE_EXHAUSTED = 8
RPC_FAILED_PRECONDITION = 9
RPC_ABORTED = 10
RPC_INTERNAL = 13
RPC_UNAVAILABLE = 14
RPC_UNAUTHENTICATED = 16


def _has(text: str, markers: Iterable[str]) -> bool:
    lowered = text.lower()
    return any(marker in lowered for marker in markers)


def capacity_code(text: str) -> str | None:
    """STOCKOUT or QUOTA_EXCEEDED when the words say so, else None.

    Rate limits ("Quota exceeded for quota metric 'Read requests'") are not quota
    shortages: they pass, so the caller retries them.
    """
    if _has(text, STOCKOUT_MARKERS):
        return STOCKOUT
    if _has(text, QUOTA_MARKERS) and not _has(text, RETRY_MARKERS):
        return QUOTA_EXCEEDED
    return None


def is_retry_later(text: str) -> bool:
    return _has(text, RETRY_MARKERS)


def api_words(error: gexc.GoogleAPIError) -> str:
    """The message the API itself wrote, without api_core's method-and-URL prefix."""
    response = getattr(error, "response", None)
    if isinstance(response, requests.Response):
        try:
            body = response.json()
        except ValueError:
            body = None
        if isinstance(body, dict) and isinstance(body.get("error"), dict):
            message = body["error"].get("message")
            if isinstance(message, str) and message:
                return message
    if isinstance(error, gexc.GoogleAPICallError):
        return str(error.message)
    return str(error)


def code_for_api_error(error: BaseException) -> str:
    """The PortError code for an exception raised by a Google client call."""
    if isinstance(error, requests.RequestException):
        return RETRYABLE  # the endpoint did not answer at all (REST transport)
    words = api_words(error) if isinstance(error, gexc.GoogleAPIError) else str(error)
    if isinstance(error, gexc.NotFound):
        return NOT_FOUND
    if isinstance(error, gexc.AlreadyExists):
        return ALREADY_EXISTS
    if isinstance(error, gexc.Conflict):
        # REST 409 covers ALREADY_EXISTS and ABORTED alike; only the words tell.
        return ALREADY_EXISTS if "already exists" in words.lower() else RETRYABLE
    capacity = capacity_code(words)
    if capacity is not None:
        return capacity
    if isinstance(error, (gexc.TooManyRequests, gexc.ServerError, gexc.RetryError)):
        return RETRYABLE
    if isinstance(error, gexc.BadRequest):
        return RETRYABLE if is_retry_later(words) else INVALID
    if isinstance(error, (gexc.Forbidden, gexc.Unauthorized)):
        return PERMISSION_DENIED
    return FAILED


def port_error(error: BaseException, context: str) -> PortError:
    """A PortError whose message names what was being done, then the API's words."""
    words = api_words(error) if isinstance(error, gexc.GoogleAPIError) else str(error)
    return PortError(code_for_api_error(error), f"{context}: {words}",
                     unanswered=is_unanswered(error))


def is_unanswered(error: BaseException) -> bool:
    """The API did not answer: no connection or no answer within the deadline (REST:
    a requests error; gRPC: DEADLINE_EXCEEDED, or UNAVAILABLE with no HTTP response)."""
    if isinstance(error, (requests.RequestException, gexc.DeadlineExceeded)):
        return True
    return isinstance(error, gexc.ServiceUnavailable) and getattr(error, "response", None) is None


def code_for_operation_error(rpc_code: int, message: str,
                             condition_codes: Iterable[str] = ()) -> str:
    """The PortError code for a GKE operation that finished (DONE) with an error.

    ``condition_codes`` are ``StatusCondition.Code`` names from the operation or the
    pool (GCE_STOCKOUT, GCE_QUOTA_EXCEEDED, ...): GKE sometimes puts the cause there
    and only a generic sentence in ``error.message``.
    """
    names = {name.upper() for name in condition_codes}
    if "GCE_STOCKOUT" in names:
        return STOCKOUT
    if "GCE_QUOTA_EXCEEDED" in names:
        return QUOTA_EXCEEDED
    capacity = capacity_code(message)
    if capacity is not None:
        return capacity
    if rpc_code == RPC_RESOURCE_EXHAUSTED:
        return RETRYABLE if is_retry_later(message) else QUOTA_EXCEEDED
    if rpc_code in (RPC_ABORTED, RPC_UNAVAILABLE, RPC_DEADLINE_EXCEEDED, RPC_INTERNAL):
        return RETRYABLE
    if rpc_code == RPC_FAILED_PRECONDITION:
        return RETRYABLE if is_retry_later(message) else INVALID
    if rpc_code == RPC_INVALID_ARGUMENT:
        return INVALID
    if rpc_code in (RPC_PERMISSION_DENIED, RPC_UNAUTHENTICATED):
        return PERMISSION_DENIED
    if rpc_code == RPC_ALREADY_EXISTS:
        return ALREADY_EXISTS
    if rpc_code == RPC_NOT_FOUND:
        return NOT_FOUND
    return FAILED
