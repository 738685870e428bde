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
	scripts/bootstrap.sh --test
	.venv/bin/pytest -m "not stack"

lint:
	.venv/bin/ruff check ki projections streams search apps scripts tests
	.venv/bin/ruff format --check ki projections streams search apps scripts tests
	.venv/bin/mypy ki projections streams search apps
	.venv/bin/lint-imports
