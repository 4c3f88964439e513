"""The few error types of gaudi-cluster, each bound to one exit code (mapped in cli.main)."""

from __future__ import annotations


class GaudiClusterError(Exception):
    """Base class: the message is one line that names the culprit and the fix."""

    exit_code = 1


class ConfigError(GaudiClusterError):
    """Bad input (flag, env var, hostfile, env file, key): nothing was launched."""

    exit_code = 2


class ClusterNotReady(GaudiClusterError):
    """Peers missing at the deadline, unreachable, or failing the preflight: nothing was launched."""

    exit_code = 3
