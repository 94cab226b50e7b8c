"""Persistence: SQLAlchemy 2 models and Alembic migrations (SQLite and PostgreSQL)."""
