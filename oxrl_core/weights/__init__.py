"""How weights travel from the trainer ranks to the vLLM engine workers (`transport.py`): a room of its own, below
both sides, so that neither imports the other."""
