"""Capacity planning (`batchsim plan`): the configuration grid, the search for the highest load
each configuration sustains under the SLO, the per-point worker, and the cost of a deployment."""
