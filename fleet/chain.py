"""The repeat model's token chain, torch-free: the traffic generator and the simulator read it.

In:  a token id (one of ``REPEAT_IDS``, the tiny tokenizer's ordinary ids) and a count.
Out: ``successors`` (each id's fixed successor: one cycle through all of ``REPEAT_IDS`` in an
     order fixed by the models' seed) and ``successor_chain`` (the tokens the repeat model
     generates greedily after a token), which ``fleet.model`` builds the repeat model from.
"""

from __future__ import annotations

import random
from functools import cache

__all__ = ["REPEAT_IDS", "SEED", "successor_chain", "successors"]

SEED = 20261129  # the tiny models' seed (fleet.model)
# the tokenizer's ordinary (not special) token ids, which the repeat model's cycle goes through;
# fleet.model.make_model checks the trained tokenizer has exactly these
REPEAT_IDS = range(3, 648)


@cache
def _successors_of(seed: int) -> dict[int, int]:  # shared: callers must not change it
    order = list(REPEAT_IDS)
    random.Random(seed).shuffle(order)
    return dict(zip(order, order[1:] + order[:1], strict=True))


def successors(seed: int = SEED) -> dict[int, int]:
    """The repeat model's successor of each of ``REPEAT_IDS``: one cycle through all of them,
    in an order fixed by ``seed``."""
    return dict(_successors_of(seed))


def successor_chain(start: int, n: int, seed: int = SEED) -> list[int]:
    """The ``n`` tokens the repeat model generates greedily after token ``start`` (one of
    ``REPEAT_IDS``): ``succ(start), succ(succ(start)), ...``; ``ValueError`` for another id."""
    nxt = _successors_of(seed)
    if start not in nxt:
        raise ValueError(f"token {start} is not an ordinary token id ({REPEAT_IDS.start}..{REPEAT_IDS.stop - 1})")
    out: list[int] = []
    token = start
    for _ in range(n):
        token = nxt[token]
        out.append(token)
    return out
