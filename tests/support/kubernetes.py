"""A real single-node Kubernetes cluster for the tests (setup/k8s/): started, driven, torn down.

``make tools`` builds its binaries once, as root (setup/k8s/build.sh, about 11
minutes cold, cached in .tools/k8s); ``up.sh`` starts containerd, etcd, the
control plane and a kubelet with all their state in a temporary folder (node
Ready in about 15 s), ``down.sh`` stops them and cleans what they touched on
the host. Pods live on a bridge, 10.88.0.0/24, where the machine is
10.88.0.1: a pod reaches a server of the test listening there (or on
0.0.0.0), the test reaches a pod at its IP. No kube-proxy, no DNS.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SETUP = ROOT / "setup" / "k8s"
CACHE = Path(os.environ.get("K8S_CACHE", ROOT / ".tools" / "k8s"))
HELM = ROOT / ".tools" / "bin" / "helm"
HOST = "10.88.0.1"  # the machine, as a pod sees it (the CNI bridge's gateway)


def missing() -> str | None:
    """Why no cluster can start here, if none can."""
    if os.geteuid() != 0:
        return "a Kubernetes node needs root (containerd, kubelet)"
    if not (CACHE / "bin" / "kubelet").exists():
        return f"no Kubernetes binaries in {CACHE / 'bin'}: run `make tools` as root"
    if not HELM.exists():
        return "no helm: run `make tools`"
    return None


@dataclass
class Cluster:
    """A running cluster: its state folder, kubectl and helm pointed at it."""

    state: Path

    @property
    def env(self) -> dict[str, str]:
        helm = self.state / "helm"
        return {
            **os.environ,
            "KUBECONFIG": str(self.state / "admin.kubeconfig"),
            "HELM_CACHE_HOME": str(helm / "cache"),
            "HELM_CONFIG_HOME": str(helm / "config"),
            "HELM_DATA_HOME": str(helm / "data"),
        }

    def run(
        self, *args: str, timeout: float = 120, stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            args, input=stdin, capture_output=True, text=True, timeout=timeout,
            check=False, env=self.env,
        )  # fmt: skip

    def kubectl(self, *args: str, timeout: float = 120, stdin: str | None = None) -> str:
        done = self.run(str(CACHE / "bin" / "kubectl"), *args, timeout=timeout, stdin=stdin)
        if done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)}: {done.stdout}{done.stderr}")
        return done.stdout

    def kubectl_json(self, *args: str) -> Any:
        return json.loads(self.kubectl(*args, "-o", "json"))

    def apply(self, manifest: str) -> str:
        return self.kubectl("apply", "--server-side", "-f", "-", stdin=manifest)

    def helm(self, *args: str, timeout: float = 300) -> str:
        done = self.run(str(HELM), *args, timeout=timeout)
        if done.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)}: {done.stdout}{done.stderr}")
        return done.stdout

    def import_image(self, docker_client: str, image: str) -> None:
        """``image`` from the machine's docker into the cluster's containerd (nothing pulled)."""
        save = subprocess.Popen([docker_client, "save", image], stdout=subprocess.PIPE)
        done = subprocess.run(
            ["ctr", "-a", str(self.state / "run" / "containerd.sock"), "-n", "k8s.io",
             "images", "import", "-"],
            stdin=save.stdout, capture_output=True, text=True, timeout=900, check=False,
        )  # fmt: skip
        save.wait(timeout=60)
        assert save.returncode == 0 and done.returncode == 0, done.stderr

    def logs(self) -> str:
        """What the cluster said about a failure: the component logs' tails."""
        lines = []
        for log in sorted((self.state / "logs").glob("*.log")):
            lines.append(f"--- {log.name}\n" + log.read_text(errors="replace")[-1500:])
        return "\n".join(lines)


STATE_PREFIX = "pgsub-k8s-"
OWNER = "owner.pid"  # the test process that started the cluster, in its state folder


def abandoned(folder: Path) -> list[Path]:
    """The clusters' state folders under ``folder`` whose run is gone (killed before its
    teardown): no owner recorded, or one no longer running."""
    gone = []
    for state in sorted(folder.glob(f"{STATE_PREFIX}*")):
        owner = state / OWNER
        try:
            os.kill(int(owner.read_text()), 0)
        except (OSError, ValueError):  # no file, no number, no such process
            gone.append(state)
    return gone


def _down(state: Path) -> None:
    env = {**os.environ, "D": str(state), "K8S_CACHE": str(CACHE)}
    subprocess.run(
        ["bash", str(SETUP / "down.sh")], env=env, capture_output=True, timeout=300, check=False
    )
    shutil.rmtree(state, ignore_errors=True)


@contextlib.contextmanager
def running_cluster() -> Iterator[Cluster]:
    """A cluster up for the block, always torn down after it (even after a half-failed start).

    One cluster runs on a machine at a time (its ports are fixed): a cluster a killed run
    left behind is torn down first, or the new control plane would find the old one's etcd
    on its port and run on its state. A cluster whose run is still going is left alone, and
    up.sh then refuses to start beside it, naming what holds the port.
    """
    for state in abandoned(Path(tempfile.gettempdir())):
        _down(state)
    state = Path(tempfile.mkdtemp(prefix=STATE_PREFIX))
    (state / OWNER).write_text(str(os.getpid()))
    env = {**os.environ, "D": str(state), "K8S_CACHE": str(CACHE)}
    try:
        up = subprocess.run(
            ["bash", str(SETUP / "up.sh")], env=env, capture_output=True, text=True,
            timeout=300, check=False,
        )  # fmt: skip
        cluster = Cluster(state)
        if up.returncode != 0:
            raise RuntimeError(
                f"setup/k8s/up.sh failed:\n{up.stdout[-3000:]}{up.stderr[-3000:]}\n"
                + cluster.logs()
            )
        yield cluster
    finally:
        _down(state)
