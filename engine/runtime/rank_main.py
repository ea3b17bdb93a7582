"""``python -m engine.runtime.rank_main``: one tensor-parallel rank > 0, started by rank 0
(engine/distributed/ranks.RankGroup), its arguments pickled on stdin.

The rank loads its shard into its own ModelRunner, then runs every step rank 0 sends it over
the control pipe until rank 0 says stop (None) or goes away.
"""

import logging
import os
import pickle
import socket
import sys
from multiprocessing.connection import Connection

from engine.distributed.ranks import unpack_step
from engine.runtime.model_runner import ModelRunner
from engine.models.loader import iter_weights
from engine.models.registry import resolve_model_path

logger = logging.getLogger("engine.runtime.rank_main")  # run as __main__


def rank_main(rank: int, port: int, control_port: int, token: bytes, config, model_config,
              max_model_len: int, eos_token_ids: list[int]) -> None:
    """A rank > 0: load this rank's shard, then run every step rank 0 sends until told to stop."""
    logging.basicConfig(level=os.environ.get("LOG_LEVEL", "WARNING"),
                        format=f"%(asctime)s %(levelname)s rank {rank} %(name)s: %(message)s")
    pipe = Connection(socket.create_connection(("127.0.0.1", control_port)).detach())
    pipe.send((token, rank))
    try:
        weights = iter_weights(resolve_model_path(config.model), model_config)
        runner = ModelRunner(config, model_config, max_model_len, weights, eos_token_ids,
                             rank=rank, port=port)
        while True:
            try:
                packed = pipe.recv()
            except (EOFError, OSError):  # rank 0 is gone
                break
            if packed is None:
                break
            runner.run_shard(unpack_step(packed))
    except Exception:
        logger.exception("tensor-parallel rank %d failed", rank)
        os._exit(1)  # not a clean teardown: rank 0 must see this rank gone


if __name__ == "__main__":
    rank_main(*pickle.loads(sys.stdin.buffer.read()))
