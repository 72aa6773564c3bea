# The README's two commands. Each one does all set-up first (scripts/setup.sh; fast when ready).
.PHONY: demo test test-slow setup

setup:
	@scripts/setup.sh

demo: setup
	.venv/bin/strata demo

test: setup
	.venv/bin/python -m pytest

# Long training checks and benchmark-sized runs, excluded from the default run.
test-slow: setup
	.venv/bin/python -m pytest -m slow
