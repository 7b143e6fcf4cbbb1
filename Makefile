# The two commands (README): `make demo` and `make test`. Both install into ./.venv first if needed.
# `make test` is the fast lane: every test but the integration runs not marked `quick`; `make test-all` runs them all.
# Two test processes share the machine (pytest-xdist): a run leaves a core idle through much of its start-up, which
# the other fills. The tests marked `alone` (timed deadlines and exits) run after them, one at a time.
.PHONY: install demo test test-all

install:
	@bash scripts/install.sh

demo: install
	.venv/bin/oxrl demo

test: install
	.venv/bin/python -m pytest -q -n 2 --dist loadfile --durations=10 -m "not integration or quick"

test-all: install
	.venv/bin/python -m pytest -q -n 2 --dist loadfile --durations=25 -m "not alone"
	.venv/bin/python -m pytest -q --durations=10 -m alone
