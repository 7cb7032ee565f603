"""`S3Storage`: checkpoint folders under ``s3://bucket/prefix``, through boto3.

boto3 is imported only here, when an S3 storage is created. Every request is retried with
exponential backoff on transient errors (connection failures, timeouts, throttling, 5xx);
anything else fails at once. Errors name the bucket, the key and the endpoint, never the
credentials.

No request names a key outside the prefix: keys with empty, ``.`` or ``..`` parts are
refused (`UnsafePathError`) before any request (an S3-compatible service or a proxy that
normalises paths would otherwise resolve them elsewhere), listed folder names that are not
plain names are skipped, and listed keys outside the prefix are never deleted.
"""

from __future__ import annotations

import functools
import logging
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

from trainkit.checkpoint._confine import split_key
from trainkit.checkpoint._errors import StorageError, UnsafePathError
from trainkit.checkpoint._storage import join

__all__ = ["S3Storage"]

T = TypeVar("T")
log = logging.getLogger(__name__)

_INSTALL_HINT = 'S3 checkpoints need boto3: pip install "trainkit-checkpoint[s3]"'
_MISSING = frozenset({"404", "NoSuchKey", "NotFound"})
_CHANGED = frozenset({"412", "PreconditionFailed", "409", "ConditionalRequestConflict"})
_DENIED = frozenset(
    {"403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken"}
)
_TRANSIENT = frozenset(
    {
        "InternalError",
        "RequestTimeout",
        "RequestTimeTooSkewed",
        "ServiceUnavailable",
        "SlowDown",
        "Throttling",
        "ThrottlingException",
    }
)
_USERINFO = re.compile(r"(?<=://)[^/@\s]+@")
_SESSION_LOCK = threading.Lock()


class S3Storage:
    """Checkpoint folders under ``s3://bucket/prefix`` (any S3-compatible service).

    Args:
        url: ``"s3://bucket"`` or ``"s3://bucket/prefix"``.
        endpoint_url: the service's endpoint (MinIO, a test server); default: AWS's.
        region_name: the bucket's region; default: boto3's configuration.
        profile_name: a profile of the AWS config files; default: boto3's choice.
        aws_access_key_id: credentials; by default boto3 finds them its usual way
            (environment, config files, instance role).
        aws_secret_access_key: see ``aws_access_key_id``.
        aws_session_token: see ``aws_access_key_id``.
        client: a boto3 S3 client to use as it is (the options above are then unused).
        attempts: tries per request, the first included, on transient errors.
        backoff: seconds before the first retry; doubled for each further one.
        max_backoff: the longest wait between two tries, in seconds.
    """

    def __init__(
        self,
        url: str,
        *,
        endpoint_url: str | None = None,
        region_name: str | None = None,
        profile_name: str | None = None,
        aws_access_key_id: str | None = None,
        aws_secret_access_key: str | None = None,
        aws_session_token: str | None = None,
        client: Any = None,
        attempts: int = 5,
        backoff: float = 0.5,
        max_backoff: float = 30.0,
    ):
        parts = urlsplit(str(url))
        if parts.scheme != "s3" or not parts.netloc:
            raise ValueError(f"{url!r} is not an S3 URL; use 's3://bucket' or 's3://bucket/prefix'")
        if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
            raise ValueError(f"attempts={attempts!r} is not valid; use a positive number of tries")
        self.bucket, self.prefix = parts.netloc, parts.path.strip("/")
        if self.prefix:
            split_key(self.prefix, f"s3://{self.bucket}")  # no '..' in the prefix either
        self.url = f"s3://{join(self.bucket, self.prefix)}"
        self.endpoint = (
            _USERINFO.sub("***@", endpoint_url) if endpoint_url else "the default AWS endpoint"
        )
        self.attempts, self.backoff, self.max_backoff = attempts, backoff, max_backoff
        self._secrets = {s for s in (aws_secret_access_key, aws_session_token) if s}
        if client is None:
            client = self._make_client(
                endpoint_url, region_name, profile_name, aws_access_key_id,
                aws_secret_access_key, aws_session_token,
            )  # fmt: skip
        self._client = client

    def __repr__(self) -> str:
        return f"S3Storage({self.url!r}, endpoint={self.endpoint!r})"

    def _make_client(self, endpoint_url: str | None, region: str | None, *creds: Any) -> Any:
        try:
            import boto3  # noqa: F401  (the session below is made from it)
            from botocore.config import Config
        except ImportError as err:
            raise ImportError(_INSTALL_HINT) from err
        profile, key_id, secret, token = creds
        session = _session(profile)
        # One retry layer, ours, with backoff and messages we control.
        config = Config(retries={"total_max_attempts": 1}, connect_timeout=10, read_timeout=120)
        with _SESSION_LOCK:  # creating clients from one session is not thread-safe
            client = session.client(
                "s3",
                endpoint_url=endpoint_url,
                region_name=region,
                aws_access_key_id=key_id,
                aws_secret_access_key=secret,
                aws_session_token=token,
                config=config,
            )
            found = None if secret else session.get_credentials()  # already resolved: cached
        if found is not None:
            frozen = found.get_frozen_credentials()
            self._secrets |= {s for s in (frozen.secret_key, frozen.token) if s}
        return client

    # --- Storage ---------------------------------------------------------------------------

    def local_path(self, key: str) -> None:
        return None

    def upload(self, source: Path, key: str) -> None:
        # upload_file switches to a multipart upload for large shards.
        self._call("upload to", key, self._client.upload_file,
                   Filename=str(source), Bucket=self.bucket, Key=self._key(key))  # fmt: skip

    def download(self, key: str, target: Path) -> None:
        self._call("download of", key, self._client.download_file,
                   Bucket=self.bucket, Key=self._key(key), Filename=str(target))  # fmt: skip

    def read_bytes(self, key: str) -> bytes:
        def read() -> bytes:
            return self._client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"].read()

        return self._call("read of", key, read)

    def write_bytes(self, key: str, data: bytes) -> None:
        self._call("upload to", key, self._client.put_object,
                   Bucket=self.bucket, Key=self._key(key), Body=data)  # fmt: skip

    def exists(self, key: str) -> bool:
        try:
            self._call("look-up of", key, self._client.head_object,
                       Bucket=self.bucket, Key=self._key(key))  # fmt: skip
            return True
        except FileNotFoundError:
            return bool(self._list(key, limit=1))  # a "folder": keys under it

    def list_folders(self) -> list[str]:
        prefix = self._key("") + "/" if self.prefix else ""

        def names() -> list[str]:
            pages = self._client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=prefix, Delimiter="/"
            )
            found = (p["Prefix"] for page in pages for p in page.get("CommonPrefixes", ()))
            names = (p[len(prefix) :].rstrip("/") for p in found if p.startswith(prefix))
            # A key such as "prefix/../x" lists as the folder "..": never one of ours.
            return sorted(n for n in names if n not in {"", ".", ".."} and "\\" not in n)

        return self._call("listing of", "", names)

    def delete(self, key: str) -> None:
        if not key:
            raise ValueError(f"refusing to delete everything under {self.url}")
        keys = self._list(key)
        inside = self._key(key) + "/"
        outside = [k for k in keys if not k.startswith(inside) or ".." in k.split("/")]
        if outside:
            raise UnsafePathError(
                f"the listing of s3://{join(self.bucket, inside)} returned keys outside it "
                f"({outside[:3]}); nothing was deleted"
            )
        self._call("delete of", key, self._client.delete_object,
                   Bucket=self.bucket, Key=self._key(key))  # fmt: skip
        for start in range(0, len(keys), 1000):  # the most one request takes
            batch = {"Objects": [{"Key": k} for k in keys[start : start + 1000]], "Quiet": True}
            self._call("delete of", key, self._client.delete_objects,
                       Bucket=self.bucket, Delete=batch)  # fmt: skip

    # --- ConditionalStorage: the folder's lock ---------------------------------------------

    def read_versioned(self, key: str) -> tuple[bytes, str | None]:
        def read() -> tuple[bytes, str]:
            answer = self._client.get_object(Bucket=self.bucket, Key=self._key(key))
            return answer["Body"].read(), answer["ETag"]

        try:
            return self._call("read of", key, read)
        except FileNotFoundError:
            return b"", None

    def delete_if(self, key: str, version: str) -> bool:
        # A read, then a delete: a run that took the key over in between (after this one's
        # lease expired) loses its lock file, and finds out at its next renewal.
        if self.read_versioned(key)[1] != version:
            return False
        self.delete(key)
        return True

    def write_if(self, key: str, data: bytes, version: str | None) -> bool:
        condition = {"IfNoneMatch": "*"} if version is None else {"IfMatch": version}
        try:
            self._call("conditional upload to", key, self._client.put_object,
                       Bucket=self.bucket, Key=self._key(key), Body=data, **condition)  # fmt: skip
        except _Changed:
            return False
        return True

    # --- requests --------------------------------------------------------------------------

    def _key(self, key: str) -> str:
        if key:
            split_key(key, self.url)  # refuses '', '.', '..' parts before any request
        return join(self.prefix, key)

    def _list(self, folder: str, limit: int | None = None) -> list[str]:
        """Keys of the objects under the folder ``folder`` (all of them when it is empty)."""
        prefix = self._key(folder) + "/" if self._key(folder) else ""

        def keys() -> list[str]:
            pages = self._client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket,
                Prefix=prefix,
                PaginationConfig={"MaxItems": limit} if limit else {},
            )
            return [item["Key"] for page in pages for item in page.get("Contents", ())]

        return self._call("listing of", folder, keys)

    def _call(self, what: str, key: str, request: Callable[..., T], /, **kwargs: Any) -> T:
        """``request(**kwargs)``, retried with backoff on transient errors."""
        where = f"s3://{join(self.bucket, self._key(key))}"
        for attempt in range(1, self.attempts + 1):
            try:
                return request(**kwargs)
            except Exception as err:
                code = _code(err)
                if code in _MISSING:
                    raise FileNotFoundError(f"{where} does not exist") from None
                if code in _CHANGED:
                    raise _Changed(where) from None
                if not _transient(err, code) or attempt == self.attempts:
                    raise StorageError(self._message(what, where, err, code, attempt)) from None
                delay = min(self.backoff * 2 ** (attempt - 1), self.max_backoff)
                log.warning(
                    "%s %s failed (%s); retrying in %.2g s (attempt %d of %d)",
                    what, where, self._clean(_describe(err)), delay, attempt, self.attempts,
                )  # fmt: skip
                time.sleep(delay)
        raise AssertionError("unreachable")

    def _message(self, what: str, where: str, err: Exception, code: str, attempt: int) -> str:
        tries = f" (tried {attempt} times)" if attempt > 1 else ""
        detail = self._clean(_describe(err))
        if _is_connection_error(err):
            return (
                f"cannot reach the S3 endpoint {self.endpoint} for bucket {self.bucket!r} "
                f"({what} {where}){tries}: {detail}. Check endpoint_url and the network"
            )
        if code == "NoSuchBucket":
            return f"S3 bucket {self.bucket!r} does not exist at {self.endpoint} ({what} {where})"
        if code in _DENIED:
            return (
                f"{what} {where} was refused by {self.endpoint} ({code}): check the "
                "credentials and the bucket's permissions"
            )
        return f"{what} {where} failed at {self.endpoint}{tries}: {detail}"

    def _clean(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return _USERINFO.sub("***@", text)


class _Changed(Exception):
    """A conditional request found the key changed (HTTP 412 / 409)."""


@functools.cache
def _session(profile: str | None) -> Any:
    # One session per profile: each new one re-reads botocore's service models (~0.2 s).
    import boto3

    return boto3.session.Session(profile_name=profile)


def _cause(err: BaseException) -> BaseException:
    # boto3's transfers wrap client errors (S3UploadFailedError, RetriesExceededError).
    from boto3.exceptions import RetriesExceededError, S3UploadFailedError

    if isinstance(err, RetriesExceededError) and err.last_exception is not None:
        return err.last_exception
    if isinstance(err, S3UploadFailedError) and err.__context__ is not None:
        return err.__context__
    return err


def _code(err: BaseException) -> str:
    from botocore.exceptions import ClientError

    cause = _cause(err)
    return (
        str(cause.response.get("Error", {}).get("Code", ""))
        if isinstance(cause, ClientError)
        else ""
    )


def _is_connection_error(err: BaseException) -> bool:
    from botocore.exceptions import ConnectionError, HTTPClientError

    return isinstance(_cause(err), ConnectionError | HTTPClientError)


def _transient(err: BaseException, code: str) -> bool:
    from botocore.exceptions import ClientError

    cause = _cause(err)
    if _is_connection_error(cause) or code in _TRANSIENT:
        return True
    status = (
        cause.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        if isinstance(cause, ClientError)
        else 0
    )
    return status >= 500 or (code.isdigit() and int(code) >= 500)


def _describe(err: BaseException) -> str:
    from botocore.exceptions import ClientError

    cause = _cause(err)
    if isinstance(cause, ClientError):
        error = cause.response.get("Error", {})
        return f"{error.get('Code', 'error')}: {error.get('Message', '')}".rstrip(": ")
    return f"{type(cause).__name__}: {cause}"
