#!/usr/bin/env bash
# Downloads the Debian packages decodegraph's full build needs (spdlog, fmt, GoogleTest, Google
# Benchmark, CLI11, nlohmann-json) into a folder, on a machine with package access, for a GPU
# machine without it. Nothing is installed here.
#   usage: scripts/fetch-gpu-deps.sh [DIR]          (DIR defaults to .deps, which git ignores)
# On the GPU machine, unpack into a prefix of its own (never over /) and point CMake at it:
#   for f in DIR/*.deb; do dpkg -x "$f" /opt/deps; done
#   export LD_LIBRARY_PATH=/opt/deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
#   cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH=/opt/deps/usr \
#         -DCMAKE_CUDA_ARCHITECTURES=90
# Download on a machine with the same Debian release (and architecture) as the GPU machine.
set -euo pipefail

dir=${1:-.deps}
# The -dev packages CMake's find_package needs (GTest's config also names gmock's libraries).
dev_pkgs=(libspdlog-dev libfmt-dev libgtest-dev libgmock-dev googletest libbenchmark-dev
          libcli11-dev nlohmann-json3-dev)

if [ -z "$(find /var/lib/apt/lists -maxdepth 1 -name '*Packages*' -print -quit 2>/dev/null)" ]; then
  if [ "$(id -u)" -eq 0 ]; then
    apt-get update -qq
  else
    echo "fetch-gpu-deps.sh: no package lists; run 'sudo apt-get update' first" >&2
    exit 1
  fi
fi

# The shared libraries the -dev packages link against (libspdlog1.10, libfmt9, ...), read from
# their dependencies so the names follow the Debian release; the C/C++ runtime is everywhere.
runtime=()
for p in "${dev_pkgs[@]}"; do
  while read -r dep; do
    case "$dep" in
      *-dev|libc6|libgcc-s1|libstdc++6|"") ;;
      *) runtime+=("$dep") ;;
    esac
  done < <(apt-cache depends --no-recommends --no-suggests --no-conflicts --no-breaks \
             --no-replaces --no-enhances "$p" | awk '$1 == "Depends:" && $2 ~ /^lib/ {print $2}')
done
mapfile -t all < <(printf '%s\n' "${dev_pkgs[@]}" "${runtime[@]}" | sort -u)

mkdir -p "$dir"
cd "$dir"
echo "fetch-gpu-deps.sh: downloading ${all[*]}"
apt-get download -qq "${all[@]}"
ls -1 ./*.deb
du -sh .
