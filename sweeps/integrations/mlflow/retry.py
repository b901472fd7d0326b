"""MLflow calls that survive a server's bad moments: which failures are an outage (waited out, retried with the
same arguments), a server error (retried, said when it repeats), a refusal (403) or an untrusted certificate
(raised at once); the retrying client every MlflowStore call goes through, MLflow's own HTTP retries while it
logs a model, and MLflow's run links kept out of the output (they would show a password).
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from mlflow.exceptions import MlflowException

from calib_core.redaction import has_credentials, redact
from sweeps.outage import FIRST_WAIT_S, MAX_WAIT_S, Unavailable
from sweeps.outage import OutageRetry as _OutageRetry

# MLflow prints "View run ... at: URL" when a run ends on an http(s) store (TrackingServiceClient._log_url),
# the URL carrying the tracking URI's user-info password; its documented switch turns those lines off.
QUIET_RUN_LINKS_ENV = "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"


# HTTP statuses that mean "the server is not serving right now", not "the request is wrong"
_UNAVAILABLE_CODES = ("error code 429", "error code 502", "error code 503", "error code 504")


# An HTTP 500: the server (or a proxy before it) failed this one call. Transient: it is retried with the same
# arguments, like an outage, but said only when a call fails twice (a flaky server must not print a line per
# blip). MLflow reports it as urllib3's "too many 500 error responses" (its HTTP retries off: MlflowStore.client),
# or "error code 500" from a response it read. 4xx are the request's fault: raised at once (429 and 408 aside).
_SERVER_ERROR = re.compile(r"too many 500 error responses|error code 500\b|500 Server Error")


_SERVER_ERROR_CODES = ("INTERNAL_ERROR", "TEMPORARILY_UNAVAILABLE")  # a RestException decoded from a 5xx body


_UNREACHABLE_TEXT = (
    "Max retries exceeded",
    "Connection refused",
    "Connection aborted",
    "ConnectionError",
    "RemoteDisconnected",
    "timeout exception",
    "timed out",
    "Connection reset",
    *_UNAVAILABLE_CODES,
)


OUTAGE_FIRST_WAIT_S = FIRST_WAIT_S  # the first retry after a failed call; doubled each time (sweeps/outage.py)


OUTAGE_MAX_WAIT_S = MAX_WAIT_S  # ... up to this (the server is noticed back at most this late)


class TrackingUnavailable(Unavailable):
    """The tracking server stayed unreachable past `tracking.outage_timeout_s`."""


def is_server_error(exc: BaseException) -> bool:
    """Whether a client call failed with an HTTP 500 from the server (transient: retried), not a 4xx."""
    from mlflow.exceptions import RestException

    if isinstance(exc, RestException):
        return exc.error_code in _SERVER_ERROR_CODES
    response = getattr(exc, "response", None)  # requests' HTTPError (artifact uploads and downloads)
    if response is not None and getattr(response, "status_code", None) == 500:
        return True
    return isinstance(exc, MlflowException) and bool(_SERVER_ERROR.search(str(exc)))


def is_forbidden(exc: BaseException) -> bool:
    """Whether the server refused a call for want of permission (HTTP 403: MLflow's basic-auth app answers it with
    a plain-text body, so the client reports the status in its message)."""
    from mlflow.exceptions import RestException

    if isinstance(exc, RestException):
        return exc.error_code == "PERMISSION_DENIED"
    return isinstance(exc, MlflowException) and "error code 403" in str(exc)


def is_untrusted_tls(exc: BaseException) -> bool:
    """Whether a call failed because the server's TLS certificate does not verify against the client's CAs
    (MLFLOW_TRACKING_SERVER_CERT_PATH, else the system's); requests reports it as a ConnectionError."""
    import ssl

    if isinstance(exc, ssl.SSLCertVerificationError):
        return True
    return "CERTIFICATE_VERIFY_FAILED" in str(exc)


def is_outage(exc: BaseException) -> bool:
    """Whether a client call failed because the server could not be reached or failed (HTTP 500), not because the
    call was wrong: the calls to retry."""
    if is_untrusted_tls(exc):
        return False  # a certificate the client does not trust: waiting does not fix it
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return True
    try:
        import requests

        if isinstance(exc, (requests.exceptions.ConnectionError, requests.exceptions.Timeout)):
            return True
    except ImportError:  # pragma: no cover - mlflow depends on requests
        pass
    if is_server_error(exc):
        return True
    if isinstance(exc, MlflowException):
        text = str(exc)
        return any(t in text for t in _UNREACHABLE_TEXT)
    return False


class OutageRetry(_OutageRetry):
    """The sweep's outage policy (sweeps/outage.py) for the MLflow tracking server at `uri`.

    One line when the server goes away (not one per retry), one when it is back; past `limit_s`
    since the first failure, TrackingUnavailable with a one-line reason naming `tracking.outage_timeout_s`.
    MLflow's own HTTP retries are turned off for http(s) stores (MlflowStore.client), so this is the
    one place that decides how long the sweep waits. A retried call sends the same arguments
    (log_batch keeps its metrics' timestamps), so a call that did reach the server before the
    connection dropped (or before a proxy answered HTTP 500) is stored once (MLflow's SQL store skips identical
    metric rows; tags, params, statuses and artifacts are overwritten with the same value). Calls that must not
    take effect twice (creating a run, deleting a tag) go through `call_checked`, which looks before resending.

    An HTTP 500 is retried the same way, but a call's first one is not announced: a failed call that its
    first retry delivers is a blip of a flaky server or proxy, not an outage worth two lines.
    """

    def __init__(
        self, uri: str, limit_s: float, say: Any = None, sleep: Any = time.sleep, clock: Any = time.monotonic
    ) -> None:
        super().__init__(
            "MLflow tracking server",
            redact(uri),
            "tracking.outage_timeout_s",
            limit_s,
            is_outage,
            TrackingUnavailable,
            say=say,
            sleep=sleep,
            clock=clock,
        )
        self.uri = uri
        self._blip = threading.local()  # this thread's failure is its call's first HTTP 500: retried quietly

    def call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """fn(*args, **kwargs), retried while the server is unreachable or answers HTTP 500."""
        return self.call_checked(fn, None, *args, **kwargs)

    def call_checked(self, fn: Any, settled: Any, *args: Any, **kwargs: Any) -> Any:
        """fn(*args, **kwargs) retried as `call` does, for a call that must not take effect twice: before each
        retry `settled()` (None: no check) looks whether the failed attempt took effect all the same (the server
        stored it, only its answer was lost) and returns its result then, else None (fn is sent again)."""
        tries = 0

        def attempt() -> Any:
            nonlocal tries
            tries += 1
            self._blip.first = self._blip.server_error = False
            if tries > 1 and settled is not None:
                done = settled()
                if done is not None:
                    return done
            try:
                return fn(*args, **kwargs)
            except Exception as exc:
                self._blip.server_error = is_server_error(exc)
                self._blip.first = tries == 1 and self._blip.server_error
                raise

        return super().call(attempt)

    def _failed(self, how: str = "unreachable") -> float:
        if getattr(self._blip, "first", False):
            # not announced (nor counted as the start of an outage): its retry a second later usually delivers it
            with self._lock:
                return 0.0 if self.down_since is None else float(self.clock() - self.down_since)
        if getattr(self._blip, "server_error", False):  # the line says what is wrong: the server answers, with errors
            return super()._failed("answers HTTP 500")
        return super()._failed(how)


FLUENT_HTTP_RETRIES = 5  # MLflow's own retries of each request while it logs a model (1 s backoff doubling: ~30 s)


@contextmanager
def fluent_http_retries(tracking_uri: str, waits_out_outages: bool) -> Iterator[None]:
    """MLflow's own HTTP retries on, for the requests MLflow makes itself inside (mlflow.pyfunc.log_model: dozens of
    calls and one upload per file of the model, ~80 for the champion), when the store of `tracking_uri` waits out
    outages (MlflowStore.retry is set).

    Our retries (OutageRetry) wrap one client call each, and retrying the whole model logging after any failed
    request of it would never finish against a server that fails a share of them (P(80 requests all pass) is
    nil at 5 % failures). So each of those requests is retried where it is sent: uploads are PUTs of the same
    bytes (urllib3 rewinds the file), a repeated POST at worst leaves a second logged model PENDING, which
    MlflowStore.completed_export finalizes FAILED. Process-wide (MLflow reads the variables per request): only
    the driver logs to MLflow at that point, the trials' writer having closed."""
    if not waits_out_outages or not tracking_uri.startswith(("http://", "https://")):
        yield
        return
    names = ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR")
    saved = {k: os.environ.get(k) for k in names}
    os.environ.update({names[0]: str(FLUENT_HTTP_RETRIES), names[1]: "1"})
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def quiet_run_links(tracking_uri: str) -> None:
    """No "View run ... at: URL" lines from MLflow: a user's setting wins, unless the URL would show a password."""
    if has_credentials(tracking_uri):
        os.environ[QUIET_RUN_LINKS_ENV] = "true"
    else:
        os.environ.setdefault(QUIET_RUN_LINKS_ENV, "true")


class RetryingClient:
    """An MlflowClient whose method calls go through OutageRetry."""

    def __init__(self, client: Any, retry: OutageRetry) -> None:
        self._client, self._retry = client, retry

    @property
    def unwrapped(self) -> Any:
        """The client without the retries (for the look-ups of `OutageRetry.call_checked`, which retries itself)."""
        return self._client

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            return self._retry.call(attr, *args, **kwargs)

        return call
