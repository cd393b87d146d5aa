#!/usr/bin/env bash
# The tools `make test` checks deploy/ and the status page with:
#  - promtool, from Debian's prometheus package, and chromium (headless, for the page at / of
#    the HTTP endpoint), from Debian's chromium package (installed when run as root);
#  - a container engine to build and run deploy/Dockerfile: Debian's docker.io (its client has
#    BuildKit built in) and debootstrap for the base image (as root; the test starts dockerd);
#  - helm, built with Go from the module proxy into .tools/bin (a few minutes, once);
#  - versitygw, a real S3 gateway over a folder (the object store the tests and benchmarks
#    put the warehouse in: docs/testing.md), built with Go likewise (about a minute, once).
# Idempotent: does nothing when all are there.
set -euo pipefail

HELM_VERSION="$1"   # e.g. v3.22.0
TOOLS_BIN="$2"      # e.g. .tools/bin
VERSITYGW_VERSION="${3:-v1.8.0}"

missing=()
command -v promtool >/dev/null || missing+=(prometheus)
command -v chromium >/dev/null || missing+=(chromium)
if [ "$(id -u)" = 0 ]; then
  command -v dockerd >/dev/null || missing+=(docker.io)
  command -v debootstrap >/dev/null || missing+=(debootstrap)
fi
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "setup: installing Debian's ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "setup: missing Debian packages: ${missing[*]} (install them, as root)" >&2
    exit 1
  fi
fi

if [ ! -x "$TOOLS_BIN/helm" ] || ! "$TOOLS_BIN/helm" version --short | grep -q "^$HELM_VERSION"; then
  echo "setup: building helm $HELM_VERSION with Go into $TOOLS_BIN"
  mkdir -p "$TOOLS_BIN"
  GOBIN="$(cd "$TOOLS_BIN" && pwd)" go install "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
fi
# go install embeds no version in the binary: a marker file says which one was built.
if [ ! -x "$TOOLS_BIN/versitygw" ] || [ ! -f "$TOOLS_BIN/.versitygw-$VERSITYGW_VERSION" ]; then
  echo "setup: building versitygw $VERSITYGW_VERSION with Go into $TOOLS_BIN"
  mkdir -p "$TOOLS_BIN"
  GOBIN="$(cd "$TOOLS_BIN" && pwd)" go install "github.com/versity/versitygw/cmd/versitygw@$VERSITYGW_VERSION"
  rm -f "$TOOLS_BIN"/.versitygw-*
  touch "$TOOLS_BIN/.versitygw-$VERSITYGW_VERSION"
fi
"$TOOLS_BIN/helm" version --short
echo "versitygw $VERSITYGW_VERSION"
promtool --version | head -1
