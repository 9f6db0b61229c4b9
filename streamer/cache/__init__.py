"""What stays in memory: the expert budget, the hot-expert cache and its eviction policies."""
