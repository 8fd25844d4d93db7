"""``S3Store``: the artifact store in an S3 bucket (AWS or any S3-compatible server), via boto3.

Configuration is the bucket, an optional key prefix, an optional endpoint URL (path-style
addressing is used with a custom endpoint, as MinIO and most S3-compatible servers need)
and an optional region. Credentials come from the standard AWS chain (environment, shared
config, instance or pod identity); this module never reads, logs or repeats them.

S3 has no append. ``append_jsonl`` reads the object, adds the new lines and writes it back.
That is safe because each ledger has a single writer (one sandbox's agent writes its own
``ledger-<i>.jsonl``); two concurrent writers of one S3 ledger could lose records. A
single ``put_object`` is atomic, so readers still see whole ledgers only.

Every botocore failure becomes a ``StoreError`` sentence naming the object and the store.
It knows nothing about what the objects mean.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from polymorph.contract import timeouts
from polymorph.contract.errors import StoreError
from polymorph.contract.store.base import JsonRecord, KeyNotFound, Store, complete_lines, encode_jsonl
from polymorph.contract.store.layout import check_key, check_prefix

if TYPE_CHECKING:
    from boto3.session import Session
    from mypy_boto3_s3 import S3Client

__all__ = ["S3Store"]

_MISSING_CODES = frozenset({"NoSuchKey", "404", "NotFound"})


def _tries(attempts: int) -> str:
    return "1 try" if attempts == 1 else f"{attempts} tries"


class S3Store(Store):
    """A store in ``s3://bucket/prefix``. The bucket must exist; the store never creates it."""

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        endpoint_url: str | None = None,
        region: str | None = None,
        *,
        session: Session | None = None,
        limits: timeouts.Limits = timeouts.S3,
    ) -> None:
        """``session`` lets callers that open many stores share one boto3 session (clients are cheaper
        then); ``limits`` bound every call (``polymorph.contract.timeouts``)."""
        import boto3  # imported here so that local-only users never pay for it
        from botocore.config import Config

        if not bucket:
            raise StoreError("an S3 store needs a bucket name")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        if self.prefix:
            check_prefix(self.prefix)
        self.endpoint_url = endpoint_url
        self.region = region
        self.uri = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        self.limits = limits
        self._session = session or boto3.session.Session()
        config = Config(
            # total_max_attempts counts the first try (botocore's max_attempts does not).
            retries={"total_max_attempts": limits.attempts, "mode": "standard"},
            connect_timeout=limits.connect_s,
            read_timeout=limits.read_s,
            s3={"addressing_style": "path"} if endpoint_url else {},
        )
        self._client: S3Client = self._session.client(
            "s3", endpoint_url=endpoint_url, region_name=region, config=config
        )

    def with_limits(self, limits: timeouts.Limits) -> S3Store:
        """The same store through a client with other limits (a start-up probe tries once, briefly)."""
        return S3Store(
            self.bucket, self.prefix, self.endpoint_url, self.region, session=self._session, limits=limits
        )

    def _key(self, key: str) -> str:
        check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def uri_for(self, key: str) -> str:
        return f"s3://{self.bucket}/{self._key(key)}"

    @contextlib.contextmanager
    def _errors(self, action: str, key: str) -> Iterator[None]:
        """Turn botocore exceptions into one-sentence StoreErrors (never mentioning credentials)."""
        from botocore.exceptions import (
            BotoCoreError,
            ClientError,
            ConnectTimeoutError,
            EndpointConnectionError,
            NoCredentialsError,
            ReadTimeoutError,
        )

        where = self.uri_for(key) if key else self.uri
        try:
            yield
        except ClientError as exc:
            error = exc.response.get("Error", {})
            code = str(error.get("Code", ""))
            if code in _MISSING_CODES:
                raise KeyNotFound(f"store {self.uri} has no object {key}") from None
            if code == "NoSuchBucket":
                raise StoreError(
                    f"the bucket {self.bucket} of store {self.uri} does not exist; create it first"
                ) from None
            if code in ("AccessDenied", "403", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
                raise StoreError(
                    f"S3 refused to {action} {where}: access denied ({code}); check the store credentials"
                ) from None
            raise StoreError(
                f"S3 failed to {action} {where}: {code} {error.get('Message', '')}".rstrip()
            ) from None
        except NoCredentialsError:
            raise StoreError(
                f"no AWS credentials found for store {self.uri}; set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY or an AWS profile"
            ) from None
        except ReadTimeoutError:
            raise StoreError(
                f"the S3 endpoint {self._endpoint()} accepted the connection but did not answer "
                f"within {self.limits.read_s:g} s ({_tries(self.limits.attempts)}) to {action} {where}"
            ) from None
        except ConnectTimeoutError:
            raise StoreError(
                f"the S3 endpoint {self._endpoint()} did not accept a connection "
                f"within {self.limits.connect_s:g} s ({_tries(self.limits.attempts)}) to {action} {where}"
            ) from None
        except EndpointConnectionError:
            endpoint = self._endpoint()
            raise StoreError(f"cannot reach the S3 endpoint {endpoint} to {action} {where}") from None
        except BotoCoreError as exc:
            raise StoreError(f"S3 failed to {action} {where}: {exc}") from None

    def _endpoint(self) -> str:
        return self.endpoint_url or "the default AWS endpoint"

    def put_bytes(self, key: str, data: bytes) -> None:
        with self._errors("write", key):
            self._client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data)

    def get_bytes(self, key: str) -> bytes:
        with self._errors("read", key):
            return self._client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"].read()

    def exists(self, key: str) -> bool:
        try:
            with self._errors("check", key):
                self._client.head_object(Bucket=self.bucket, Key=self._key(key))
        except KeyNotFound:
            return False
        return True

    def list(self, prefix: str = "") -> list[str]:
        check_prefix(prefix)
        full = f"{self.prefix}/{prefix}" if self.prefix else prefix
        strip = len(self.prefix) + 1 if self.prefix else 0
        keys: list[str] = []
        with self._errors("list", ""):
            for page in self._client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=full
            ):
                # A key ending in / is a "folder" marker some S3 tools create; it is not an object here.
                keys.extend(
                    obj["Key"][strip:] for obj in page.get("Contents", []) if not obj["Key"].endswith("/")
                )
        return sorted(keys)

    def delete(self, key: str) -> None:
        with self._errors("delete", key):
            self._client.delete_object(Bucket=self.bucket, Key=self._key(key))

    def append_jsonl(self, key: str, records: Sequence[JsonRecord]) -> None:
        data = encode_jsonl(records, key)
        if not data:
            return
        try:
            existing = self.get_bytes(key)
        except KeyNotFound:
            existing = b""
        self.put_bytes(key, complete_lines(existing) + data)
