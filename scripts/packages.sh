#!/usr/bin/env bash
# Installs those of the Debian packages named on the command line that are missing (apt-get, with
# sudo when not root); installs nothing, and needs no network, when all are there.
#   scripts/packages.sh PACKAGE...
# scripts/setup.sh names the build's packages; .ci/run the AddressSanitizer stage's compiler (clang).
set -euo pipefail
missing=()
for p in "$@"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
((${#missing[@]})) || exit 0
echo "packages: installing ${missing[*]}"
sudo=()
[ "$(id -u)" = 0 ] || sudo=(sudo)
"${sudo[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq "${missing[@]}"
