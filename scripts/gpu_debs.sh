#!/usr/bin/env bash
# Fetches the Debian -dev packages (headers, .so links, pkg-config files) of jansson, xxhash and
# PCRE2 into .gpu-debs/ (git-ignored), for GPU machines that have those libraries' runtimes but
# not their development files and cannot install packages. Carry .gpu-debs there and unpack with
#     for f in .gpu-debs/*.deb; do dpkg -x "$f" /; done
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .gpu-debs
cd .gpu-debs
apt-get download libjansson-dev libxxhash-dev libpcre2-dev
