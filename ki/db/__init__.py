"""The structured layer: reference schema (models), engine/session factories, migrations."""
