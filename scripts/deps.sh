#!/usr/bin/env bash
# Installs the Debian packages graphtrain needs, if any are missing (run as root).
set -euo pipefail
need=(build-essential cmake pkg-config libopenblas-dev libjansson-dev libxxhash-dev libpcre2-dev
      libopenmpi-dev openmpi-bin coinor-libcbc-dev)
missing=()
for p in "${need[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "[deps] installing: ${missing[*]}"
    if [ "$(id -u)" -ne 0 ]; then
        echo "[deps] these Debian packages are missing and installing them needs root: ${missing[*]}" >&2
        exit 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
