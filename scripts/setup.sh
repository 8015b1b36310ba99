#!/usr/bin/env bash
# Installs what gdskit needs to build (the CLI, the library, `pip install .`), from Debian packages, only where
# something is missing. With --tests also what the tests use: pytest, and numpy and torch for the Python tests'
# array and torch.distributed parts (torch is large: about 210 MB to download; GDSKIT_SETUP_NO_TORCH=1 leaves it
# out and those tests skip with the reason).
set -euo pipefail

packages=(build-essential cmake ninja-build pkg-config git
          libcli11-dev libfmt-dev nlohmann-json3-dev liburing-dev
          libgtest-dev libgmock-dev libbenchmark-dev
          python3 python3-dev python3-venv pybind11-dev gnuplot-nox)
if [ "${1:-}" = --tests ]; then
  packages+=(python3-pytest python3-numpy)
  [ "${GDSKIT_SETUP_NO_TORCH:-0}" = 1 ] || packages+=(python3-torch)
fi

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
