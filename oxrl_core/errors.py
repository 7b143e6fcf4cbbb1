"""The exceptions the CLI turns into one line.

`OxrlError`, a user mistake: its message names the thing, the bad value and what is allowed; the CLI prints it and
exits 2. `Hang`, a run whose actors stopped answering (`cluster/watchdog.py`): the CLI prints who was stuck and how
to resume, and exits 1. Anything else is an internal failure and keeps its traceback.
"""


class OxrlError(Exception):
    """A user mistake (bad config, bad data, missing file): message is one line."""


class Hang(Exception):
    """A wait on the run's actors passed its deadline. `report`: who was stuck and each one's Python stacks (the run
    folder's stacks.txt)."""

    def __init__(self, message: str, report: str):
        super().__init__(message)
        self.report = report
