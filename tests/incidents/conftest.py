from tests.pg import postgres_server

__all__ = ["postgres_server"]
