#!/usr/bin/env bash
# make-fake-fabric.sh OPENMPI_ROOT OPENMPI_VERSION LIBFABRIC_ROOT: TEST-ONLY. The Open MPI and libfabric
# trees an image profile puts where profiles.json says, with the stand-ins in them: an mpirun that only
# reports its version, a fi_info that finds the listed providers only with its own lib/ first on
# LD_LIBRARY_PATH, and an empty libfabric.so.1 (the probe and the doctor only look for it). The test
# passes the paths from profiles.json, so this layer writes none of its own.
set -Eeuo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
mpi_root="${1:?usage: make-fake-fabric.sh OPENMPI_ROOT OPENMPI_VERSION LIBFABRIC_ROOT}"
mpi_version="${2:?OPENMPI_VERSION}"
fabric_root="${3:?LIBFABRIC_ROOT}"

mkdir -p "$mpi_root/bin" "$mpi_root/lib" "$mpi_root/share" "$fabric_root/bin" "$fabric_root/lib"
install -m 0755 "$here/mpirun" "$mpi_root/bin/mpirun"
printf '%s\n' "$mpi_version" >"$mpi_root/share/fake-openmpi-version"
install -m 0755 "$here/fi_info" "$fabric_root/bin/fi_info"
: >"$fabric_root/lib/libfabric.so.1"
