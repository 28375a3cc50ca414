"""Batching policies: one class per policy, each ``schedule(view) -> BatchPlan``.

Importing this package registers the four built-ins (``static``,
``dynamic``, ``continuous``, ``chunked_prefill``) so that
:func:`create_policy` finds them by name.
"""

from batchsim.policies.base import PolicyConfig
from batchsim.policies.chunked_prefill import ChunkedPrefillPolicy
from batchsim.policies.continuous import ContinuousPolicy
from batchsim.policies.dynamic import DynamicPolicy
from batchsim.policies.registry import create_policy, policy_class, policy_names, register
from batchsim.policies.static import StaticPolicy

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
