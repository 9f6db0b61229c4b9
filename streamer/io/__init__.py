"""Bytes and the OS only: mappings, expert files, checkpoints, the manifest, integrity, locks.

Nothing here knows a model, a statistic or a policy; nothing here imports from above it.
"""
