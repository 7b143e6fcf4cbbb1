"""A run resolved before anything starts: its config read, laid over the machine's defaults where asked, validated
(the schema's and each algorithm's defaults applied), checked, and what the rooms below need of it, built once
(`run.py`); the checks themselves (`checks.py`)."""
