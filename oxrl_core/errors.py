"""The one exception type for user mistakes.

Its message names the thing, the bad value and what is allowed. The CLI prints
it in one line and exits 2; anything else is an internal failure and keeps its
traceback.
"""


class OxrlError(Exception):
    """A user mistake (bad config, bad data, missing file): message is one line."""
