"""`skippy cluster`: K `skippy serve` replicas behind a real cache-aware router (sglang-router).

plan (pure): what starts, on which ports, with which argv; supervise (trio): starting, restarting
and stopping the processes; command: the command line. The worker endpoints a router needs are
the server's (skippy.server.worker_api). Needs the `cluster` extra: pip install 'skippy[cluster]'.
"""
