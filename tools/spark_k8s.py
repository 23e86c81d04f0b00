"""`spark-submit --deploy-mode cluster` of examples/spark/pipeline.py onto the dev node.

One place for the Spark configuration the tests, the demo and docs/spark.md use: the image, the
drivers' ServiceAccount, requests small enough for one 2-core node, and the hostPath volume the
driver and its executors share for the Parquet files.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

SPARK_IMAGE = "tsoracle-spark:0.1.0"
JOB = "local:///opt/tsoracle-spark/examples/pipeline.py"
REPORT = "TSORACLE_PIPELINE_REPORT "


def submit_argv(api_server: str, writer: str, *, namespace: str, resource: str, data: Path,
                image: str = SPARK_IMAGE, service_account: str = "spark",
                executors: int = 2, job_args: tuple[str, ...] = ()) -> list[str]:
    volume = {"mount.path": "/data", "options.path": str(data)}
    conf = {
        "spark.kubernetes.namespace": namespace,
        "spark.kubernetes.container.image": image,
        "spark.kubernetes.container.image.pullPolicy": "IfNotPresent",
        "spark.kubernetes.authenticate.driver.serviceAccountName": service_account,
        "spark.executor.instances": str(executors),
        # One node with 2 cores runs two drivers and four executors: small CPU requests (the
        # task slots stay spark.executor.cores = 1) and half a GiB of heap each.
        "spark.kubernetes.driver.request.cores": "0.1",
        "spark.kubernetes.executor.request.cores": "0.1",
        "spark.driver.memory": "512m",
        "spark.executor.memory": "512m",
        **{f"spark.kubernetes.{role}.volumes.hostPath.data.{key}": value
           for role in ("driver", "executor") for key, value in volume.items()},
        "spark.kubernetes.submission.waitAppCompletion": "true",
    }
    argv = ["spark-submit", "--master", f"k8s://{api_server}", "--deploy-mode", "cluster",
            "--name", f"pipeline-{writer}"]
    for key, value in conf.items():
        argv += ["--conf", f"{key}={value}"]
    return [*argv, JOB, "--resource", resource, "--namespace", namespace, "--writer", writer,
            "--data", "/data/tables", *job_args]


def driver_pod(submit_output: str) -> str:
    """The driver pod's name, from spark-submit's own output."""
    found = re.search(r"submission ID [\w-]+:([\w.-]+-driver)", submit_output)
    if not found:
        raise ValueError("spark-submit printed no submission ID")
    return found.group(1)


def report(driver_log: str) -> dict[str, object]:
    """The job's report line from its driver's log."""
    for line in driver_log.splitlines():
        if line.startswith(REPORT):
            return dict(json.loads(line[len(REPORT):]))
    raise ValueError("the driver printed no report")


def prepare_data_dir(path: Path, uid: int = 65532) -> None:
    """The hostPath folder, writable by the image's user."""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["chown", "-R", f"{uid}:{uid}", str(path)], check=True)
