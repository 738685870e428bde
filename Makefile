.PHONY: demo test unit lint

# The main job: local stack, schema, demo corpus synced through CDC, search API.
demo:
	scripts/bootstrap.sh
	.venv/bin/ki demo

# Every test, against the real local stack (started and stopped here).
test:
	scripts/test.sh

# Fast tests only (no services).
unit:
	scripts/bootstrap.sh
	.venv/bin/pytest -m "not stack"

lint:
	.venv/bin/ruff check ki streams search projections tests
	.venv/bin/mypy ki streams search projections
