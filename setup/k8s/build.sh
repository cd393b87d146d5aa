#!/usr/bin/env bash
# The single-node Kubernetes cluster the tests run the chart on (tests/deploy/test_kubernetes.py):
# its Debian packages, and its binaries built from the Go module proxy, once, into a cache kept
# between runs (K8S_CACHE, default .tools/k8s). After ../shared/k8s/RECIPE.md: Kubernetes
# v1.34.4 (kube-apiserver, controller-manager, scheduler, kubelet, kubectl) through a wrapper
# module that replaces each staging module by its published v0.34.x; Debian's containerd 1.6,
# runc, etcd and CNI plugins; the pause image compiled from the module's own pause.c. A cold
# build takes about 11 minutes on 2 cores; a cached one, nothing. Needs root (apt, the cluster).
set -euo pipefail
CACHE=${K8S_CACHE:-$(cd "$(dirname "$0")/../.." && pwd)/.tools/k8s}
V=${K8S_VERSION:-v1.34.4}; SV=v0.${V#v1.}
B=$CACHE/bin
H=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$B"

if [ "$(id -u)" != 0 ]; then
  echo "setup/k8s: the test cluster needs root (containerd, kubelet); skipped" >&2
  exit 0
fi
if ! command -v etcd >/dev/null || [ ! -x /usr/lib/cni/bridge ] || ! command -v containerd >/dev/null \
   || ! command -v runc >/dev/null || ! command -v gcc >/dev/null; then
  echo "setup/k8s: installing Debian's containerd runc etcd-server containernetworking-plugins"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq containerd runc etcd-server \
    containernetworking-plugins gcc libc6-dev openssl curl iproute2 >/dev/null
fi

if [ ! -x "$B/kubelet" ] || [ ! -f "$B/.version-$V" ]; then
  echo "setup/k8s: building Kubernetes $V from the Go module proxy into $B (about 11 minutes, once)"
  WRAP=$CACHE/wrap
  mkdir -p "$WRAP" && cd "$WRAP"
  go mod download -json "k8s.io/kubernetes@$V" >/dev/null
  M=$(go env GOMODCACHE)/cache/download/k8s.io/kubernetes/@v/$V.mod
  { echo "module wrap"; echo; echo "go 1.24"; echo; echo "require k8s.io/kubernetes $V"; echo; echo "replace ("
    sed -n '/^replace (/,/^)/p' "$M" | grep '=>' | awk -v sv="$SV" '{print "\t"$1" => "$1" "sv}'; echo ")"; } > go.mod
  printf '//go:build tools\npackage wrap\nimport (\n\t_ "k8s.io/kubernetes/cmd/kube-apiserver"\n\t_ "k8s.io/kubernetes/cmd/kube-controller-manager"\n\t_ "k8s.io/kubernetes/cmd/kube-scheduler"\n\t_ "k8s.io/kubernetes/cmd/kubelet"\n\t_ "k8s.io/kubernetes/cmd/kubectl"\n)\n' > tools.go
  go mod tidy
  MINOR=$(echo "$V" | cut -d. -f2)
  LD="-s -w -X k8s.io/component-base/version.gitVersion=$V -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$MINOR -X k8s.io/component-base/version.gitTreeState=clean -X k8s.io/client-go/pkg/version.gitVersion=$V -X k8s.io/client-go/pkg/version.gitMajor=1 -X k8s.io/client-go/pkg/version.gitMinor=$MINOR"
  CGO_ENABLED=0 go build -trimpath -ldflags "$LD" -o "$B/" k8s.io/kubernetes/cmd/kube-apiserver \
    k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler \
    k8s.io/kubernetes/cmd/kubectl k8s.io/kubernetes/cmd/kubelet
  rm -f "$B"/.version-*
  touch "$B/.version-$V"
fi

# The pause image, compiled from the module's own pause.c (nothing is pulled).
if [ ! -f "$CACHE/images/pause.tar" ]; then
  mkdir -p "$CACHE/images/pause/root"
  (cd /tmp && go mod download "k8s.io/kubernetes@$V")
  gcc -Os -static -DVERSION=local -o "$CACHE/images/pause/root/pause" \
    "$(go env GOMODCACHE)/k8s.io/kubernetes@$V/build/pause/linux/pause.c"
  python3 "$H/mkimage.py" "$CACHE/images/pause/root" local/pause:3.10 "$CACHE/images/pause.tar" '["/pause"]' 'null'
fi

# The prometheus-operator's CRDs (ServiceMonitor, PrometheusRule), from its Go module's source.
POV=${PROMETHEUS_OPERATOR_VERSION:-v0.85.0}
if [ ! -f "$CACHE/crds/.version-$POV" ]; then
  mkdir -p "$CACHE/crds"
  (cd /tmp && go mod download "github.com/prometheus-operator/prometheus-operator@$POV")
  SRC=$(go env GOMODCACHE)/github.com/prometheus-operator/prometheus-operator@$POV/example/prometheus-operator-crd
  cp "$SRC/monitoring.coreos.com_servicemonitors.yaml" "$SRC/monitoring.coreos.com_prometheusrules.yaml" "$CACHE/crds/"
  chmod u+w "$CACHE/crds/"*.yaml
  rm -f "$CACHE/crds"/.version-*
  touch "$CACHE/crds/.version-$POV"
fi
echo "setup/k8s: Kubernetes $V in $B"
