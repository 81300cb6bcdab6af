#!/usr/bin/env bash
# Build the local base image `sticksat-base:bookworm` from Debian's own packages, for
# machines that reach a Debian mirror but no image registry (CI here):
#
#   debootstrap --variant=minbase bookworm DIR MIRROR   (with python3, python3-venv, python3-pip)
#   tar -C DIR -c . | docker import - sticksat-base:bookworm
#
# MIRROR is the machine's configured Debian mirror (the first URI serving `bookworm` in
# /etc/apt/sources.list or /etc/apt/sources.list.d/*), or $STICKSAT_DEBIAN_MIRROR.
# bookworm's Python is 3.11, the same minor version as the default python:3.11-slim base.
# Reuses an existing image of that tag unless --force is given. Needs root and a running
# Docker engine. Prints the image id on the last line.
set -euo pipefail

TAG=${STICKSAT_BASE_IMAGE:-sticksat-base:bookworm}
SUITE=bookworm
DOCKER=${DOCKER:-docker}
force=0
[ "${1:-}" = "--force" ] && force=1

if [ "$force" = 0 ] && "$DOCKER" image inspect "$TAG" >/dev/null 2>&1; then
    echo "base image $TAG present, reused"
    "$DOCKER" image inspect --format '{{.Id}}' "$TAG"
    exit 0
fi

debian_mirror() {
    # One-line format: deb [options] URI SUITE COMPONENTS...
    local f
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [ -f "$f" ] || continue
        awk -v suite="$SUITE" '$1 == "deb" {
                i = 2; if ($i ~ /^\[/) { while ($i !~ /\]$/) i++; i++ }
                if ($(i + 1) == suite) { print $i; exit } }' "$f"
    done
    # deb822 format: a stanza with Types: deb, Suites: ... bookworm ..., URIs: ...
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -f "$f" ] || continue
        awk -v suite="$SUITE" '
            function flush() { if (deb && has && uri != "") { print uri; found = 1 } deb = 0; has = 0; uri = "" }
            /^[[:space:]]*$/ { flush(); if (found) exit; next }
            tolower($1) == "types:" { for (i = 2; i <= NF; i++) if ($i == "deb") deb = 1 }
            tolower($1) == "suites:" { for (i = 2; i <= NF; i++) if ($i == suite) has = 1 }
            tolower($1) == "uris:" { uri = $2 }
            END { if (!found) flush() }' "$f"
    done
}

MIRROR=${STICKSAT_DEBIAN_MIRROR:-$(debian_mirror | head -n 1)}
if [ -z "$MIRROR" ]; then
    echo "no Debian mirror serving $SUITE found in /etc/apt/sources.list{,.d/*}; set STICKSAT_DEBIAN_MIRROR" >&2
    exit 1
fi

ROOT=$(mktemp -d /var/tmp/sticksat-base.XXXXXX)
trap 'rm -rf "$ROOT"' EXIT
chmod 0755 "$ROOT"   # becomes the image's /: mktemp's 0700 would lock out the non-root user
echo "debootstrap --variant=minbase $SUITE from $MIRROR"
debootstrap --variant=minbase --include=python3,python3-venv,python3-pip \
    "$SUITE" "$ROOT" "$MIRROR" > "$ROOT.log" 2>&1 || { tail -n 30 "$ROOT.log" >&2; rm -f "$ROOT.log"; exit 1; }
rm -f "$ROOT.log"
# Nothing the image needs: downloaded packages, apt lists, docs, man pages.
rm -rf "$ROOT"/var/cache/apt/archives/*.deb "$ROOT"/var/lib/apt/lists/* \
       "$ROOT"/usr/share/doc/* "$ROOT"/usr/share/man/* "$ROOT"/usr/share/info/* \
       "$ROOT"/var/log/*.log "$ROOT"/var/cache/debconf/*-old
tar --numeric-owner -C "$ROOT" -c . | "$DOCKER" import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["/bin/bash"]' \
    --message "debootstrap --variant=minbase $SUITE $MIRROR (python3, python3-venv, python3-pip)" \
    - "$TAG" >/dev/null
"$DOCKER" image inspect --format '{{.Id}}' "$TAG"
