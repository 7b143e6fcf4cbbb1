# The two commands (README): `make demo` and `make test`. Both install into ./.venv first if needed.
# `make test` is the fast lane: every test but the integration runs not marked `quick`; `make test-all` runs them all.
.PHONY: install demo test test-all

install:
	@bash scripts/install.sh

demo: install
	.venv/bin/oxrl demo

test: install
	.venv/bin/python -m pytest -q --durations=10 -m "not integration or quick"

test-all: install
	.venv/bin/python -m pytest -q --durations=25
