"""Bytes from disk: source checkpoints, the streaming layout's manifest, and the mmap expert store."""
