"""The training side: DeepSpeed engines (one Ray actor per rank) and the logprobs they compute."""
