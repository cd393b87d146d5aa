"""One storage configuration, in each engine's words (apply/delta/files/storage.py)."""

from __future__ import annotations

from apply.delta.files import storage
from apply.delta.files.storage import Storage, delta_rs_options, register, storage_for

MINIO = Storage(
    endpoint="http://127.0.0.1:9000",
    region="us-east-1",
    path_style=True,
    access_key_id="AKIDEXAMPLE",
    secret_access_key="wJalrXUtnFEMI/K7MDENG",
)


def test_delta_rs_and_obstore_get_object_stores_keys() -> None:
    assert MINIO.delta_rs_options() == {
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
        "AWS_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "AKIDEXAMPLE",
        "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG",
        "AWS_ALLOW_HTTP": "true",
        "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "false",
    }
    config, client = MINIO.obstore_config()
    assert config["aws_endpoint_url"] == "http://127.0.0.1:9000" and client == {"allow_http": True}
    assert "aws_allow_http" not in config


def test_spark_gets_s3a_settings_for_s3a_and_s3() -> None:
    conf = MINIO.spark_conf()
    assert conf["spark.hadoop.fs.s3a.endpoint"] == "http://127.0.0.1:9000"
    assert conf["spark.hadoop.fs.s3a.path.style.access"] == "true"
    assert conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] == "false"
    assert conf["spark.hadoop.fs.s3a.access.key"] == "AKIDEXAMPLE"
    assert conf["spark.hadoop.fs.s3.impl"] == "org.apache.hadoop.fs.s3a.S3AFileSystem"
    # Where uploads are buffered is the session's (the JVM's scratch): session_conf's test.
    assert "spark.hadoop.fs.s3a.buffer.dir" not in conf
    # No key configured: the SDK's own chain (environment, IRSA's web identity, instance).
    chain = Storage(region="eu-west-1").spark_conf()
    assert chain["spark.hadoop.fs.s3a.aws.credentials.provider"].endswith(
        "DefaultCredentialsProvider"
    )
    assert not any("access.key" in key for key in chain)


def test_credentials_never_show_in_a_repr() -> None:
    text = repr(MINIO)
    assert "AKIDEXAMPLE" not in text and "wJalrXUtnFEMI" not in text


def test_a_table_finds_its_warehouses_storage() -> None:
    register("s3a://lake/wh", MINIO)
    other = Storage(endpoint="https://s3.example", region="eu-west-1")
    register("s3a://lake/wh/deeper", other)
    try:
        assert storage_for("s3a://lake/wh/public/t") is MINIO
        assert storage_for("s3a://lake/wh/deeper/public/t") is other
        assert storage_for("s3a://lake/whatever/t") is storage.LOCAL
        assert delta_rs_options("/local/wh/public/t") is None
        assert delta_rs_options("s3a://lake/wh/public/t") == MINIO.delta_rs_options()
    finally:
        storage._REGISTERED.clear()
