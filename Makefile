# The two commands (README): `make demo` and `make test`. Both install into ./.venv first if needed.
# `make test` is the fast lane: every test but the integration runs not marked `quick`; `make test-all` (CI) runs
# every test but the long lane, `make test-slow`: the integration runs marked `slow` (see pyproject.toml).
.PHONY: install demo test test-all test-slow

install:
	@bash scripts/install.sh

demo: install
	.venv/bin/oxrl demo

test: install
	.venv/bin/python -m pytest -q --durations=10 -m "not integration or quick"

test-all: install
	.venv/bin/python -m pytest -q -n 2 --dist loadgroup --durations=25 --junitxml=.test-results/test-all.xml -m "not slow"

test-slow: install
	.venv/bin/python -m pytest -q -n 2 --dist loadgroup --durations=25 --junitxml=.test-results/test-slow.xml -m slow
