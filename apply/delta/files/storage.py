"""How every engine reaches the warehouse: one storage configuration, handed to each.

A warehouse is a folder of this machine or an object store URL
(``s3://``/``s3a://`` - AWS S3 and S3-compatible stores -, ``gs://``,
``abfss://``/``az://``). Three engines read and write it, and each is
told the same facts (config ``storage``: endpoint, region, path-style
addressing, credentials, plain HTTP) in its own words:

- Spark, through Hadoop's S3A connector: ``spark.hadoop.fs.s3a.*``
  (``spark_conf``), for ``s3a://`` and ``s3://`` alike;
- delta-rs, through its ``storage_options`` (``delta_rs_options``: object
  store's ``AWS_*`` keys);
- pgsub's own writer (``apply.delta.files.object_store.ObjectStore``): the same keys to
  obstore (object store's Python binding: conditional PUTs for the commit
  files), and a pyarrow file system for the Parquet files.

Credentials come from the configuration's files or the environment
(``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``),
or, given none, from the cloud's own chain (a web identity token on
Kubernetes - IRSA -, an instance profile). They never reach a log or
``/status``: ``Storage`` hides them from its ``repr``.

Which warehouse reaches which store is process configuration, as Hadoop's
is: ``register`` records a warehouse's storage at start, and the table
paths under it find it (``storage_for``).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final
from urllib.parse import urlsplit

if TYPE_CHECKING:
    import pyarrow.fs

# URL schemes of the stores pgsub's own code reaches (obstore, delta-rs, pyarrow).
OBJECT_SCHEMES: Final = frozenset({"s3", "s3a", "gs", "abfss", "abfs", "az"})
_S3: Final = frozenset({"s3", "s3a"})


@dataclass(frozen=True, slots=True)
class Storage:
    """How to reach an object store (config ``storage``)."""

    endpoint: str | None = None  # an S3-compatible server; None: the cloud's own
    region: str | None = None
    path_style: bool = False  # the bucket in the path, not the host name
    access_key_id: str | None = field(default=None, repr=False)
    secret_access_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    ca_file: str | None = None  # the CA that signed the endpoint's certificate

    @property
    def allow_http(self) -> bool:
        return self.endpoint is not None and self.endpoint.startswith("http://")

    def delta_rs_options(self) -> dict[str, str]:
        """The ``storage_options`` delta-rs and obstore take (object store's keys)."""
        options: dict[str, str] = {}
        if self.endpoint:
            options["AWS_ENDPOINT_URL"] = self.endpoint
        if self.region:
            options["AWS_REGION"] = self.region
        if self.access_key_id and self.secret_access_key:
            options["AWS_ACCESS_KEY_ID"] = self.access_key_id
            options["AWS_SECRET_ACCESS_KEY"] = self.secret_access_key
        if self.session_token:
            options["AWS_SESSION_TOKEN"] = self.session_token
        if self.allow_http:
            options["AWS_ALLOW_HTTP"] = "true"
        if self.path_style:
            options["AWS_VIRTUAL_HOSTED_STYLE_REQUEST"] = "false"
        return options

    def spark_conf(self) -> dict[str, str]:
        """Hadoop's S3A settings, as Spark configuration, for ``s3a://`` and ``s3://``
        (where S3A buffers its uploads is the session's: ``session_conf``)."""
        hadoop = "spark.hadoop.fs."
        conf = {
            f"{hadoop}s3.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
            f"{hadoop}AbstractFileSystem.s3.impl": "org.apache.hadoop.fs.s3a.S3A",
            "spark.delta.logStore.s3.impl": "io.delta.storage.S3SingleDriverLogStore",
        }
        if self.endpoint:
            conf[f"{hadoop}s3a.endpoint"] = self.endpoint
            conf[f"{hadoop}s3a.connection.ssl.enabled"] = str(not self.allow_http).lower()
        if self.region:
            conf[f"{hadoop}s3a.endpoint.region"] = self.region
        if self.path_style:
            conf[f"{hadoop}s3a.path.style.access"] = "true"
        if self.access_key_id and self.secret_access_key:
            conf[f"{hadoop}s3a.access.key"] = self.access_key_id
            conf[f"{hadoop}s3a.secret.key"] = self.secret_access_key
            if self.session_token:
                conf[f"{hadoop}s3a.session.token"] = self.session_token
                conf[f"{hadoop}s3a.aws.credentials.provider"] = (
                    "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider"
                )
            else:
                conf[f"{hadoop}s3a.aws.credentials.provider"] = (
                    "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"
                )
        else:  # the SDK's chain: environment, web identity (IRSA), profile, instance
            conf[f"{hadoop}s3a.aws.credentials.provider"] = (
                "software.amazon.awssdk.auth.credentials.DefaultCredentialsProvider"
            )
        return conf

    def obstore_config(self) -> tuple[dict[str, str], dict[str, object]]:
        """obstore's configuration and client options (the same facts as delta-rs's)."""
        config = {
            key.lower(): value
            for key, value in self.delta_rs_options().items()
            if key != "AWS_ALLOW_HTTP"
        }
        return config, {"allow_http": True} if self.allow_http else {}

    def arrow_filesystem(self, url: str) -> tuple[pyarrow.fs.FileSystem, str]:
        """A pyarrow file system over the store at ``url``, and ``url``'s path in it: where
        pgsub reads and writes Parquet and vector files."""
        import pyarrow.fs

        parts = urlsplit(url)
        if parts.scheme in _S3:
            endpoint = urlsplit(self.endpoint) if self.endpoint else None
            s3 = pyarrow.fs.S3FileSystem(
                access_key=self.access_key_id,
                secret_key=self.secret_access_key,
                session_token=self.session_token,
                region=self.region,
                endpoint_override=endpoint.netloc if endpoint else None,
                scheme=endpoint.scheme if endpoint else "https",
                force_virtual_addressing=not self.path_style and endpoint is None,
                tls_ca_file_path=self.ca_file,
            )
            return s3, f"{parts.netloc}{parts.path}".rstrip("/")
        if parts.scheme == "gs":
            return pyarrow.fs.GcsFileSystem(), f"{parts.netloc}{parts.path}".rstrip("/")
        # abfss://container@account.dfs.core.windows.net/path
        container, _, host = parts.netloc.partition("@")
        azure = pyarrow.fs.AzureFileSystem(account_name=host.split(".", 1)[0])
        return azure, f"{container}{parts.path}".rstrip("/")


LOCAL: Final = Storage()
_REGISTERED: dict[str, Storage] = {}
_LOCK = threading.Lock()


def is_object_store(location: str) -> bool:
    """Whether ``location`` is an object store URL pgsub reaches itself."""
    return urlsplit(location).scheme in OBJECT_SCHEMES


def register(warehouse: str, storage: Storage) -> None:
    """The warehouse at ``warehouse`` is reached with ``storage`` (process-wide)."""
    with _LOCK:
        _REGISTERED[warehouse.rstrip("/")] = storage


def storage_for(path: str) -> Storage:
    """How to reach ``path``: the storage registered for the warehouse holding it (the
    cloud's defaults and the environment when none is)."""
    with _LOCK:
        found = [w for w in _REGISTERED if path == w or path.startswith(w + "/")]
        return _REGISTERED[max(found, key=len)] if found else LOCAL


def delta_rs_options(path: str) -> dict[str, str] | None:
    """The ``storage_options`` delta-rs opens the table at ``path`` with (None: a local
    folder, or nothing configured)."""
    if not is_object_store(path):
        return None
    return storage_for(path).delta_rs_options() or None
