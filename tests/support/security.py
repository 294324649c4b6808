"""The Redis user the security tests give the service: its password and the only commands it may run."""

from __future__ import annotations

REDIS_PASSWORD = "redis-Secret-0815"
# Everything the service runs: reads and writes of its keys, its scripts, and the connection handshake.
SERVICE_ACL = ("on", f">{REDIS_PASSWORD}", "~*", "resetchannels", "-@all",
               "+ping", "+hello", "+auth", "+select", "+get", "+set", "+hget", "+hgetall",
               "+zmscore", "+smembers", "+sadd", "+sismember", "+scard",
               "+eval", "+incr",
               "+zrangebyscore", "+zadd", "+zrem", "+zremrangebyscore", "+hset", "+hdel", "+hincrby", "+hincrbyfloat",
               "+pexpire", "+pttl", "+hmget", "+del",
               # The drill-down: its row log (written by the commit script while a reader holds the lease).
               "+exists", "+time", "+xadd", "+xrange", "+xrevrange")
