"""``python -m engine.distributed.rank_main``: one tensor-parallel rank > 0, started by rank 0
(engine/distributed/ranks.RankGroup), its arguments pickled on stdin."""

import pickle
import sys

from engine.distributed.ranks import rank_main

if __name__ == "__main__":
    rank_main(*pickle.loads(sys.stdin.buffer.read()))
