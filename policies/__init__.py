"""Batching policies: one class per policy, each ``schedule(view) -> BatchPlan``.

Importing this package registers the four built-ins (``static``,
``dynamic``, ``continuous``, ``chunked_prefill``) so that
:func:`create_policy` finds them by name.
"""

from policies.base import PolicyConfig
from policies.chunked_prefill import ChunkedPrefillPolicy
from policies.continuous import ContinuousPolicy
from policies.dynamic import DynamicPolicy
from policies.registry import create_policy, policy_class, policy_names, register
from policies.static import StaticPolicy

__all__ = [
    "PolicyConfig",
    "create_policy",
    "policy_class",
    "policy_names",
    "register",
    "StaticPolicy",
    "DynamicPolicy",
    "ContinuousPolicy",
    "ChunkedPrefillPolicy",
]
