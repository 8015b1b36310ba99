#!/usr/bin/env bash
# Installs what gdskit needs to build and test, from Debian packages, only where something is missing.
set -euo pipefail

packages=(build-essential cmake ninja-build pkg-config git
          libcli11-dev libfmt-dev nlohmann-json3-dev liburing-dev
          libgtest-dev libgmock-dev libbenchmark-dev
          python3 python3-dev pybind11-dev gnuplot-nox)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all build dependencies are installed"
  exit 0
fi

echo "setup: installing ${missing[*]}"
sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "setup: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
  sudo_cmd=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
