"""vaco: asynchronous on-policy RL with advantage realignment and TV filtering.

Honari et al., "Align and Filter: Improving Performance in Asynchronous On-Policy RL",
arXiv:2603.01365, 2026.
"""

__version__ = "0.1.0"
