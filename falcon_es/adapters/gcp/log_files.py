"""The pods' log files in Cloud Storage, read with Google's ``google-cloud-storage``.

A task's pods write ``gs://<bucket>/logs/<job_id>/<pod_name>.log`` through GCS FUSE
(``domain.manifests``). ``falcon-es logs`` lists that folder (``storage.objects.list``)
and reads each file from an offset (``storage.objects.get``, a ranged read), so a file
that grows while the task runs is followed by reading only what was added since.

A refusal names the permission the caller lacks, since a 403 from Cloud Storage says
only "does not have storage.objects.get access" in one of several phrasings, and a
missing bucket is told from a missing object (both are 404s).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import requests
from google.api_core import exceptions as gexc
from google.auth import exceptions as auth_exceptions
from google.auth.credentials import AnonymousCredentials

from falcon_es.adapters.gcp.wiring import application_default_credentials
from falcon_es.config.settings import Settings
from falcon_es.domain.timestamps import as_timestamp
from falcon_es.domain.ports import FAILED, NOT_FOUND, PERMISSION_DENIED, LogObject, PortError

if TYPE_CHECKING:
    from google.cloud.storage import Client

#: Errors of the transport or the credentials, rather than of Cloud Storage's answer.
_UNREACHABLE = (requests.RequestException, auth_exceptions.GoogleAuthError)
#: Reading objects needs no project (it is the bucket's); the client wants one named.
NO_PROJECT = "-"
EMULATOR_PROJECT = "falcon-emulator"


class GcsLogFiles:
    """``LogFiles`` over Cloud Storage through a ``storage.Client``."""

    def __init__(self, client: Client) -> None:
        self._client = client

    def list(self, bucket: str, prefix: str) -> Sequence[LogObject]:
        where = f"gs://{bucket}/{prefix}"
        try:
            return [LogObject(blob.name, int(blob.size or 0), as_timestamp(blob.updated))
                    for blob in self._client.list_blobs(bucket, prefix=prefix)]
        except gexc.NotFound as error:
            raise PortError(NOT_FOUND, f"bucket {bucket} does not exist "
                                       f"({_words(error)})") from error
        except gexc.Forbidden as error:
            raise _refused(where, "storage.objects.list", f"bucket {bucket}", error) from error
        except (gexc.GoogleAPICallError, *_UNREACHABLE) as error:
            raise PortError(FAILED, f"listing {where}: {_words(error)}") from error

    def read(self, bucket: str, name: str, start: int = 0) -> bytes:
        where = f"gs://{bucket}/{name}"
        blob = self._client.bucket(bucket).blob(name)
        try:
            # No checksum: a ranged read of part of an object has none to compare with.
            return bytes(blob.download_as_bytes(start=start or None, checksum=None))
        except gexc.RequestRangeNotSatisfiable:
            return b""  # nothing past ``start`` yet
        except gexc.NotFound as error:
            raise PortError(NOT_FOUND, f"{where}: no such object (or no bucket {bucket}): "
                                       f"{_words(error)}") from error
        except gexc.Forbidden as error:
            raise _refused(where, "storage.objects.get", f"bucket {bucket}", error) from error
        except (gexc.GoogleAPICallError, *_UNREACHABLE) as error:
            raise PortError(FAILED, f"reading {where}: {_words(error)}") from error


def _refused(where: str, permission: str, on: str, error: gexc.GoogleAPICallError) -> PortError:
    return PortError(PERMISSION_DENIED,
                     f"{where}: Cloud Storage refused ({_words(error)}); the caller needs "
                     f"{permission} on {on} (roles/storage.objectViewer)")


def _words(error: Exception) -> str:
    """Cloud Storage's own words, without api_core's "GET https://...:" prefix."""
    message = getattr(error, "message", None)
    return str(message or error).strip()


def gcs_log_files(settings: Settings) -> GcsLogFiles:
    """Cloud Storage as ``falcon-es logs`` reads it: with Application Default Credentials,
    or anonymously from the emulator ``STORAGE_EMULATOR_HOST`` names."""
    from google.cloud import storage

    emulator = settings.gcp.storage_emulator_host
    if emulator:
        return GcsLogFiles(storage.Client(
            project=EMULATOR_PROJECT, credentials=AnonymousCredentials(),
            client_options={"api_endpoint": emulator}))
    credentials, project = application_default_credentials()
    return GcsLogFiles(storage.Client(project=project or NO_PROJECT, credentials=credentials))
