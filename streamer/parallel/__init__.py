"""Expert parallelism over mx.distributed: the group and each rank's share of the experts
(group.py, shards.py), and `streamer split`, which writes a rank's share (split.py). The layer's
side, a rank computing only its experts, is streamer/experts/parallel.py; the server's side, rank 0
answering for the group, is streamer/server/group_engine.py."""
