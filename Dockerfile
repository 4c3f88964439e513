# gaudi-cluster node image: one image for every node (master and workers), two flavors.
#
#   cpu    make image-cpu   Debian 12 + Debian's OpenMPI + a venv of requirements/cpu-image.txt installed
#                           offline from build/wheelhouse (make wheelhouse). Builds anywhere, no registry.
#   gaudi  make image       Habana pytorch-installer base + hccl_ofi_wrapper, Habana's DeepSpeed fork and
#          [PROFILE=dl1]    optimum-habana, all pinned per profile in app/gaudi_cluster/settings/profiles.json
#                           (gaudi: Gaudi 2/3, Synapse 1.24; gaudi-1.23; dl1: first-gen Gaudi on AWS DL1,
#                           Synapse 1.21), and where Open MPI, libfabric and EFA live. Needs vault.habana.ai
#                           and the internet.
#
# Build it with make (`make image`, `make image-cpu`): a plain `docker build` of this folder takes the
# defaults below, the cpu flavor on gaudi-cluster/debian:bookworm, a local image that only `make base-image`
# makes (no registry has it), from build/wheelhouse that only `make wheelhouse` fills. By hand, after both:
#   docker build -t gaudi-cluster:cpu --build-arg FLAVOR=cpu --build-arg BASE_IMAGE=gaudi-cluster/debian:bookworm .
#   (gaudi: `make image DRY_RUN=1` prints the command with every build argument of the profile)
#
# Every stage derives from the one BASE_IMAGE, so the classic builder never needs another image.
# Layers go from rarely to often changed: OS packages, Python packages, prebuilt ops, then the
# entrypoint and the project code (app/) last, so editing app/ rebuilds in seconds.

ARG BASE_IMAGE=gaudi-cluster/debian:bookworm
ARG FLAVOR=cpu

# ---- base: the flavor's environment on top of BASE_IMAGE ---------------------------------------------
FROM ${BASE_IMAGE} AS base-cpu
FROM ${BASE_IMAGE} AS base-gaudi
# One libfabric, where the profile puts it: the base's EFA installation (dl1) or the one the system step
# builds (1.23 on, whose base runs the EFA installer --minimal). The hccl_ofi_wrapper is built against it
# and has no RPATH, so every process (HCCL, fi_info, the probe, the ranks' presets) finds it here, as the
# wrapper's README asks; Habana's base leaves it off both paths. No default: only the profile knows.
ARG LIBFABRIC_ROOT
ENV LIBFABRIC_ROOT=${LIBFABRIC_ROOT} \
    PATH=${LIBFABRIC_ROOT}/bin:${PATH} \
    LD_LIBRARY_PATH=${LIBFABRIC_ROOT}/lib${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}

# ---- system: OS packages per flavor (no ssh host keys, no private keys) -----------------------------
# base-cpu or base-gaudi: a stage of this file, not an image to pin.
# hadolint ignore=DL3006
FROM base-${FLAVOR} AS system
ARG FLAVOR=cpu
ARG DS_ACCELERATOR=cpu
# gaudi only (make image passes them from the profile): what the base must be, where its Open MPI and
# EFA libraries are, the libfabric to build (or the base's to use) and the wrapper's pin.
ARG SYNAPSE_VERSION=""
ARG HABANA_TORCH_PLUGIN_VERSION=""
ARG HCCL_OFI_WRAPPER_COMMIT=""
ARG HCCL_OFI_WRAPPER_INTERFACE=""
# The wrapper's source tarball at that commit (default: GitHub's archive; a file:// URL builds offline).
ARG HCCL_OFI_WRAPPER_URL=""
ARG OPENMPI_ROOT=""
ARG OPENMPI_MAJOR=""
ARG LIBFABRIC_SOURCE=""
ARG LIBFABRIC_VERSION=""
ARG LIBFABRIC_URL=""
ARG LIBFABRIC_SHA256=""
ARG LIBFABRIC_CONFIGURE=""
ARG EFA_ROOT=""
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
COPY image/install-system.sh image/build-hccl-ofi-wrapper.sh image/check-hccl-ofi-wrapper.sh \
     image/build-libfabric.sh /opt/gaudi-cluster/image/
RUN bash /opt/gaudi-cluster/image/install-system.sh "${FLAVOR}"

# ---- python: the cpu venv, made offline from the wheelhouse (which stays out of the final image) -----
FROM system AS python
ARG FLAVOR=cpu
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# scripts/build-image.sh tags this stage (the build cache) instead of leaving it dangling.
LABEL io.gaudi-cluster.stage=build
# The glob makes a missing build/wheelhouse reach check-wheelhouse.sh, which says how to fix it.
COPY requirements/cpu-image.txt build/wheelhous[e] /tmp/wheelhouse/
COPY image/check-wheelhouse.sh image/install-python.sh requirements/cpu-image.txt /opt/gaudi-cluster/image/
RUN bash /opt/gaudi-cluster/image/install-python.sh venv

# ---- final ------------------------------------------------------------------------------------------
FROM system
ARG FLAVOR=cpu
ARG DS_ACCELERATOR=cpu
# gaudi only (make image passes them from the profile): the Python packages on top of Habana's PyTorch.
ARG PROFILE=""
ARG PT_VERSION=""
# The fork's git URL and the full commit make image chose (given, recorded, or git ls-remote of the branch).
ARG HABANA_DEEPSPEED_REPO=""
ARG HABANA_DEEPSPEED_REF=""
ARG HABANA_DEEPSPEED_COMMIT_PREFIX=""
ARG HABANA_DEEPSPEED_VERSION=""
ARG PYTHON_PINS=""
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV PATH=/opt/venv/bin:${PATH} \
    TORCH_EXTENSIONS_DIR=/opt/torch-extensions \
    DS_ACCELERATOR=${DS_ACCELERATOR} \
    GAUDI_CLUSTER_FLAVOR=${FLAVOR} \
    PYTHONDONTWRITEBYTECODE=1
COPY --from=python /opt/venv /opt/venv
COPY image/install-python.sh /opt/gaudi-cluster/image/
# runtime: .pth (app on sys.path), launchers; gaudi: DeepSpeed fork + optimum-habana, /opt/gaudi-cluster/PROFILE.
# ops (cpu): DeepSpeed's shm comm op, compiled once here instead of by every rank at run time.
RUN bash /opt/gaudi-cluster/image/install-python.sh runtime \
    && bash /opt/gaudi-cluster/image/install-python.sh ops

WORKDIR /workspace
EXPOSE 3022
# SIGTERM reaches tini, which forwards it to sshd (worker) or the control plane (master); the master
# stops the job on every node and exits 143. Give it time: docker stop -t 30 / stop_grace_period.
STOPSIGNAL SIGTERM
# Every check is a `docker exec` (~0.1 s of CPU in dockerd/runc): at 2 s that was 1.7 of 2 cores for
# 32 idle nodes. 15 s keeps it in the noise; anything that must know sooner (the harness, the master)
# runs the same script or its own sshd wait instead of waiting on Docker's schedule.
HEALTHCHECK --interval=15s --timeout=3s --start-period=30s --retries=3 \
    CMD ["/opt/gaudi-cluster/entrypoint/healthcheck.sh"]
# tini is PID 1 (reaps, forwards signals); no -g: the master manages its own process groups.
ENTRYPOINT ["/usr/bin/tini", "--", "/opt/gaudi-cluster/entrypoint/entrypoint.sh"]
# No default arguments: the role comes from GAUDI_CLUSTER_ROLE (default worker), so `docker run IMAGE`
# is a worker, `-e GAUDI_CLUSTER_ROLE=master` or `IMAGE master JOB...` the master, `IMAGE --help` the CLI.
CMD []

COPY entrypoint/ /opt/gaudi-cluster/entrypoint/
# The bundled workload first, then its default data (deterministic), then the rest of the code: editing
# the control plane does not regenerate the data.
COPY app/train/ /opt/gaudi-cluster/app/train/
# ALLOW_MISSING_DATA=1 builds an image without the embedded data when app/train/data.py does not exist yet.
ARG ALLOW_MISSING_DATA=0
RUN if [ -f /opt/gaudi-cluster/app/train/data.py ]; then \
        python -m train.data --out /opt/gaudi-cluster/data; \
    elif [ "${ALLOW_MISSING_DATA}" = 1 ]; then \
        echo "note: app/train/data.py is absent; no embedded data (ALLOW_MISSING_DATA=1)"; \
    else \
        echo "error: app/train/data.py is absent, so the default data cannot be made; fix: add it, or build with --build-arg ALLOW_MISSING_DATA=1" >&2; \
        exit 1; \
    fi
COPY app/ /opt/gaudi-cluster/app/
# The venv's bytecode is compiled at install; compile ours too, or (PYTHONDONTWRITEBYTECODE) every
# probe, rank agent and rank compiles it again at start. Then start the control plane once with the
# image's Python (gaudi: the base's 3.10): code it cannot import fails this build, not every node's start.
RUN python -m compileall -q /opt/gaudi-cluster/app && gaudi-cluster --version

ARG VERSION=dev
ARG GIT_REV=unknown
# What `gaudi-cluster doctor` compares across nodes: the release plus a digest of the code itself and, on
# the gaudi flavor, of the commits it installed (PINS): a dirty tree built twice with the same revision,
# or one profile built against two fork heads, still tells apart.
RUN printf '%s-%s-%s\n' "${VERSION}" "${GIT_REV}" \
      "$( { find /opt/gaudi-cluster/app -type f -name '*.py' -print0 | sort -z | xargs -0 sha256sum; \
            cat /opt/gaudi-cluster/PINS 2>/dev/null || true; } | sha256sum | cut -c1-12)" \
      > /opt/gaudi-cluster/BUILD_ID
ARG SOURCE_URL=""
LABEL org.opencontainers.image.title="gaudi-cluster" \
      org.opencontainers.image.description="Multi-node DeepSpeed training node (${FLAVOR} flavor): sshd, launchers, control plane" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${GIT_REV}" \
      org.opencontainers.image.source="${SOURCE_URL}" \
      io.gaudi-cluster.flavor="${FLAVOR}" \
      io.gaudi-cluster.profile="${PROFILE}" \
      io.gaudi-cluster.habana-deepspeed.commit="${HABANA_DEEPSPEED_REF}" \
      io.gaudi-cluster.habana-deepspeed.repo="${HABANA_DEEPSPEED_REPO}"
