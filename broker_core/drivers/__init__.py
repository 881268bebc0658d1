"""How operations run: the one driver loop (loop.py) and the ways a step reaches Redis (direct.py's
blocking sockets, multiplexed.py's shared asyncio connection, coalesce.py's merged duplicate calls)."""
