"""`python -m corral.server [--demo] [--host H] [--port P]`: the server without the CLI package
(used by tests/server_fixture.py). Everything else comes from CORRAL_* environment variables."""

from __future__ import annotations

import argparse

from corral.config import Settings
from corral.server.run import serve


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m corral.server", description=__doc__)
    parser.add_argument("--demo", action="store_true", help="demo users, groups and an example job")
    parser.add_argument("--host", default=None)
    parser.add_argument("--port", type=int, default=None)
    args = parser.parse_args(argv)
    settings = Settings()
    update = {k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
    serve(settings.model_copy(update=update) if update else settings, demo=args.demo)


if __name__ == "__main__":
    main()
