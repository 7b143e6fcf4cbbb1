# The two commands (README): `make demo` and `make test`. Both install into ./.venv first if needed.
.PHONY: install demo test

install:
	@bash scripts/install.sh

demo: install
	.venv/bin/oxrl demo

test: install
	.venv/bin/python -m pytest -q --durations=25
