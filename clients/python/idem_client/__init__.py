"""idem_client: the idem REST API for Python (standard library only).

    from idem_client import IdemClient
    idem = IdemClient("http://127.0.0.1:8080", token=os.environ["IDEM_TOKEN"])
    session = idem.begin("trip-ana-1", ["flights.reserve", "hotels.book"])
    answer = session.call("call_1", "flights.reserve", {...}, wait=10)
    session.commit()

See clients/python/README.md.
"""

from .client import IdemClient, OpenSagaSession, Response
from .decisions import canonical_json, model_decision
from .errors import (
    IdemCallIdReusedError,
    IdemConflictError,
    IdemError,
    IdemForbiddenError,
    IdemNetworkError,
    IdemNotFoundError,
    IdemSagaNotOpenError,
    IdemServerError,
    IdemUnauthorizedError,
    IdemUnavailableError,
    IdemValidationError,
)
from .retry import NO_RETRY, RetryEvent, RetryPolicy
from .types import CallAnswer, Submitted
from . import vocabulary

__all__ = [
    "IdemClient",
    "OpenSagaSession",
    "Response",
    "CallAnswer",
    "Submitted",
    "RetryPolicy",
    "RetryEvent",
    "NO_RETRY",
    "canonical_json",
    "model_decision",
    "IdemError",
    "IdemConflictError",
    "IdemSagaNotOpenError",
    "IdemCallIdReusedError",
    "IdemNotFoundError",
    "IdemUnauthorizedError",
    "IdemForbiddenError",
    "IdemValidationError",
    "IdemUnavailableError",
    "IdemServerError",
    "IdemNetworkError",
    "vocabulary",
]

__version__ = "0.1.0"
