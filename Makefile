# The README's two commands. Each one does all set-up first (scripts/setup.sh; fast when ready).
.PHONY: demo test test-slow test-stress setup

setup:
	@scripts/setup.sh

demo: setup
	.venv/bin/strata demo

test: setup
	.venv/bin/python -m pytest

# Long training checks and benchmark-sized runs, excluded from the default run.
test-slow: setup
	.venv/bin/python -m pytest -m slow

# The default suite while two busy processes load both cores: no test may depend on the machine's speed.
test-stress: setup
	scripts/test_stress.sh
