"""Continued pre-training: the language-model loss on every token of plain text, packed into blocks of `data.max_tokens`.

The loss is SFT's (`sft.py`) with every token a response token; what differs is the data (`text` records).
"""

from oxrl_core.algs import sft
from oxrl_core.algs.base import Algorithm

ALGORITHM = Algorithm("cpt", "sl", "text", sft.batch_loss, sft.make_args, sft.nll_means)
