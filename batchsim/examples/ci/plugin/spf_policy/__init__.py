"""batchsim-spf: shortest-prompt-first continuous batching, as a policy plugin."""

from spf_policy.policy import ShortestPromptFirst, SPFConfig

__all__ = ["ShortestPromptFirst", "SPFConfig"]
