"""`python -m corral.server [--demo] [--host H] [--port P]`: the server without the CLI package
(used by tests/server_fixture.py). Everything else comes from CORRAL_* environment variables."""

from __future__ import annotations

import argparse
import sys

from corral.config import Settings, settings_error
from corral.server.run import serve


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m corral.server", description=__doc__)
    parser.add_argument("--demo", action="store_true", help="demo users, groups and an example job")
    parser.add_argument("--host", default=None)
    parser.add_argument("--port", type=int, default=None)
    args = parser.parse_args(argv)
    update = {k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
    try:
        # Built with the options, not model_copy'd after: the validators (CORRAL_PORT=65535
        # without a workspace port, a workspace port equal to the portal's) see --port too.
        settings = Settings(**update)
    except ValueError as exc:  # pydantic's ValidationError: name the setting, no traceback
        print(f"error: {settings_error(exc)}. Nothing was written.", file=sys.stderr)
        raise SystemExit(1) from None
    serve(settings, demo=args.demo)


if __name__ == "__main__":
    main()
