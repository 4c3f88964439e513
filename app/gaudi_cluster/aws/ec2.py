"""The thin boto3 edge: a session for one region, and the Cloud that reads, creates and deletes.

boto3 is imported here only, when a command connects; a missing boto3 or missing credentials is one
line with the fix. Waits share one deadline (a monotonic time).
"""

from __future__ import annotations

from typing import Any

from gaudi_cluster.aws.calls import NO_CREDENTIALS, AwsCallFailed, Resources, calling, one_line
from gaudi_cluster.aws.creates import Converged, Creates
from gaudi_cluster.aws.deletes import Deletes
from gaudi_cluster.errors import ConfigError

__all__ = ["AwsCallFailed", "Cloud", "Converged", "Resources", "calling", "connect", "new_session"]

INSTALL_HINT = "pip install 'gaudi-cluster[aws]'"


def new_session(region: str) -> Any:
    """A boto3 session for one region (tests wrap this to register botocore event handlers)."""
    try:
        import boto3
        from botocore.exceptions import BotoCoreError
    except ImportError:
        raise ConfigError(
            f"gaudi-cluster aws needs boto3, which is not installed; fix: {INSTALL_HINT}"
        ) from None
    try:
        return boto3.session.Session(region_name=region)
    except BotoCoreError as error:  # e.g. AWS_PROFILE naming a profile that does not exist
        raise ConfigError(f"AWS configuration: {one_line(str(error))}; fix: aws configure list") from None


def connect(region: str) -> Cloud:
    session = new_session(region)
    known: set[str] = set()
    for partition in ("aws", "aws-cn", "aws-us-gov"):
        known.update(session.get_available_regions("ec2", partition_name=partition))
    if region not in known:
        raise ConfigError(
            f"--region {region} is not an EC2 region; fix: --region us-east-1 (DL1: us-east-1, us-west-2)"
        )
    if session.get_credentials() is None:
        raise ConfigError(NO_CREDENTIALS)
    return Cloud(session.client("ec2"), session.client("ssm"), session.client("service-quotas"), region)


class Cloud(Creates, Deletes):
    """One region's EC2, SSM and Service Quotas clients, and the operations `aws` needs from them."""
