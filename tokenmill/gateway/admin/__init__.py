"""The admin API (`/admin/...`, the admin key only): keys created, listed, updated, rotated
and revoked (keys.py); everyone's usage and the guardrail and tool-call audit logs
(usage.py). And `/v1/usage`, where a key sees its own usage (the admin key: anyone's)."""

from tokenmill.gateway.admin.app import build_admin_app
from tokenmill.gateway.admin.common import is_admin, public_key

__all__ = ["build_admin_app", "is_admin", "public_key"]
