"""`python -m skippy.cluster._router_main FLAGS`: sglang-router's own launcher, but with the API key
read from $SKIPPY_API_KEY (as `skippy serve` reads it) so that it stays out of the process list.
sglang-router 0.3.2 then sends that key to every --worker-urls replica as its Bearer token, and
asks clients for it."""

from __future__ import annotations

import os
import sys


def main(argv: list[str] | None = None) -> None:
    from sglang_router.launch_router import launch_router, parse_router_args

    args = parse_router_args(sys.argv[1:] if argv is None else argv)
    key = os.environ.get("SKIPPY_API_KEY")
    if key:
        args.api_key = key
    launch_router(args)


if __name__ == "__main__":
    main()
