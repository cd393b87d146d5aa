#!/usr/bin/env bash
# The tools `make test` checks deploy/ with:
#  - promtool, from Debian's prometheus package (installed when run as root);
#  - helm, built with Go from the module proxy into .tools/bin (a few minutes, once).
# Idempotent: does nothing when both are there.
set -euo pipefail

HELM_VERSION="$1"   # e.g. v3.22.0
TOOLS_BIN="$2"      # e.g. .tools/bin

if ! command -v promtool >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "setup: installing Debian's prometheus (for promtool)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus >/dev/null
  else
    echo "setup: promtool is missing: install Debian's prometheus package" >&2
    exit 1
  fi
fi

if [ ! -x "$TOOLS_BIN/helm" ] || ! "$TOOLS_BIN/helm" version --short | grep -q "^$HELM_VERSION"; then
  echo "setup: building helm $HELM_VERSION with Go into $TOOLS_BIN"
  mkdir -p "$TOOLS_BIN"
  GOBIN="$(cd "$TOOLS_BIN" && pwd)" go install "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
fi
"$TOOLS_BIN/helm" version --short
promtool --version | head -1
