"""The catalog on an S3 warehouse (`s3://` and `s3a://`) through pyiceberg's FileIO. No S3
service runs on these machines; moto's server, which speaks S3's HTTP protocol, stands in for
it (the object store is the only part emulated: the catalog, the oracle and the clients are
real). Credentials come from the environment, the endpoint from --io-property."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pyarrow as pa
import pytest
from pyarrow import fs
from pyiceberg.catalog.rest import RestCatalog

import tsoracle
from tsoracle.catalog.serve import CatalogConfig, RunningCatalog

KEYS = {"AWS_ACCESS_KEY_ID": "tsoracle-test", "AWS_SECRET_ACCESS_KEY": "s3cr3t-key",
        "AWS_REGION": "us-east-1"}


@pytest.fixture
def s3(monkeypatch):
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    for k, v in KEYS.items():
        monkeypatch.setenv(k, v)
    fs.S3FileSystem(endpoint_override=endpoint, access_key=KEYS["AWS_ACCESS_KEY_ID"],
                    secret_key=KEYS["AWS_SECRET_ACCESS_KEY"], region="us-east-1",
                    scheme="http", allow_bucket_creation=True).create_dir("lake")
    yield endpoint
    server.stop()


@pytest.mark.parametrize("scheme", ["s3", "s3a"])
def test_tables_live_in_an_s3_warehouse(s3, tmp_path, scheme):
    url = f"sqlite:///{tmp_path / 'oracle.db'}"
    asyncio.run(tsoracle.init(url))
    io = (("s3.endpoint", s3), ("s3.region", "us-east-1"))
    config = CatalogConfig(url=url, warehouse=f"{scheme}://lake/wh", port=0, io_properties=io)
    with RunningCatalog(config) as running:
        client = RestCatalog("c", uri=running.url, **dict(io),
                             **{"s3.access-key-id": KEYS["AWS_ACCESS_KEY_ID"],
                                "s3.secret-access-key": KEYS["AWS_SECRET_ACCESS_KEY"]})
        client.create_namespace("db")
        table = client.create_table("db.t", schema=pa.schema([("id", pa.int64())]))
        assert table.metadata_location.startswith(f"{scheme}://lake/wh/db/t/metadata/")
        table.append(pa.table({"id": [1, 2, 3]}))
        again = client.load_table("db.t")
        assert sorted(again.scan().to_arrow()["id"].to_pylist()) == [1, 2, 3]
        store = fs.S3FileSystem(endpoint_override=s3, region="us-east-1", scheme="http")
        listed = store.get_file_info(fs.FileSelector("lake/wh/db/t/metadata"))
        names = {f.path.rsplit("/", 1)[1] for f in listed}
        assert again.metadata_location.rsplit("/", 1)[1] in names
        assert {e.metadata_file.rsplit("/", 1)[1] for e in again.metadata.metadata_log} <= names
        with pytest.raises(Exception, match="outside the catalog's warehouse"):
            client.create_table("db.elsewhere", schema=pa.schema([("id", pa.int64())]),
                                location=f"{scheme}://other-bucket/x")


@pytest.mark.served  # the CLI in a process of its own
def test_a_secret_on_the_command_line_is_refused(tmp_path):
    done = subprocess.run([sys.executable, "-m", "tsoracle.cli", "catalog", "serve",
                           "--warehouse", "s3://lake/wh",
                           "--io-property", "s3.secret-access-key=s3cr3t-key"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "AWS_SECRET_ACCESS_KEY" in done.stderr and "s3cr3t-key" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
