#!/bin/sh
# setup.sh — installs the Debian -dev packages paradec builds against. Idempotent:
# when everything is present it only checks (a fraction of a second).
set -u
need="libzstd-dev libjansson-dev libyaml-dev libxxhash-dev zlib1g-dev zstd libpcre2-dev gnuplot-nox libmicrohttpd-dev curl jq clang"
missing=""
for p in $need; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
echo "setup: installing$missing" >&2
if [ "$(id -u)" = 0 ]; then
    SUDO=""
elif command -v sudo >/dev/null 2>&1; then
    SUDO="sudo"
else
    echo "setup: missing packages:$missing — run as root: apt-get install$missing" >&2
    exit 1
fi
if ! { $SUDO apt-get install -y -qq $missing >/dev/null 2>&1 ||
       { $SUDO apt-get update -qq >/dev/null 2>&1 && $SUDO apt-get install -y -qq $missing >/dev/null; }; }; then
    echo "setup: could not install$missing — install them by hand (apt-get install$missing) and run make again" >&2
    exit 1
fi
