"""Bearer-token check for the Kubernetes emulator, in the EKS token format.

Called from ``routing.handle`` before anything else. EKS tokens are ``k8s-aws-v1.`` followed by the base64url
form of a presigned STS GetCallerIdentity URL (what ``aws eks get-token`` and kvfleet's client build), so the
production path HyperPod DescribeCluster → EKS DescribeCluster → token → Kubernetes client runs unchanged.
"""

from __future__ import annotations

import base64

TOKEN_PREFIX = "k8s-aws-v1."


def token_ok(header: str | None, *, allow_anonymous: bool = False) -> bool:
    """A payload that decodes to a URL must be a GetCallerIdentity one; opaque payloads (test kubeconfigs
    with ``k8s-aws-v1.xxx``) are accepted. No header at all is accepted only when ``allow_anonymous``."""
    if not header:
        return allow_anonymous
    if not header.startswith("Bearer " + TOKEN_PREFIX):
        return False
    payload = header[len("Bearer " + TOKEN_PREFIX):].strip()
    if not payload:
        return False
    try:
        decoded = base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)).decode()
    except (ValueError, UnicodeDecodeError):
        return True
    if decoded.startswith("http"):
        return "GetCallerIdentity" in decoded
    return True
