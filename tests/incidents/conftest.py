from tests.oncall.conftest import env, smtp
from tests.pg import postgres_server

__all__ = ["env", "postgres_server", "smtp"]
