"""The Redis key layout of the state, and the Lua scripts that write it.

The scripts are called by `state.redis.RedisStore`, which builds their KEYS and ARGV: a key
added here goes into `RedisStore._payload` too. Format 8's shards are the exception: the script
names them from a prefix and the shard counts it keeps (they share the partition's hash tag, so
its slot on a cluster); their Lua, and its expiry rule, is in `state.shard_scripts`.

Key layout (``ns`` is the namespace setting, followed by ``#<generation>`` once
the state has been rebuilt for a new metric configuration; ``{ns:P}`` is a Redis
Cluster hash tag, so that everything of one input partition P =
``topic:partition`` lives in one slot and one script can write it atomically):

    {ns}:config                STRING  the metric configuration the state is built with (JSON)
    {ns}:format                STRING  `state.format.FORMAT_VERSION` of the stored state (absent: 1)
    {ns}:generation            STRING  how many times it was rebuilt; the keys of earlier
                                       generations expire, or are a few small keys per partition
    ns:partitions              SET     every partition ever claimed (for scrapes)
    ns:segment:<label>         SET     the admitted values of a segment label (at most the cap)
    {ns:P}:epoch               STRING  fencing token: a random one per claim, so that even a Redis
                                       rolled back by its AOF never hands out the same token twice
    {ns:P}:meta                HASH    offset (next to consume), clock (the engine's clock at the last
                                       commit: greatest event time, or wall time with --clock wall),
                                       rowseq (how many row log entries were ever written),
                                       aggmark (the offset its last commit wrote aggchg up to) and
                                       aggepoch (counts the times aggchg missed commits: see below)
    {ns:P}:counts              HASH    event counts: impression, judgment, click, duplicate:*, rejected:*,
                                       judgment_source:*, judgment_unlisted_source
    {ns:P}:q:<query_id>        HASH    the query's judgments, and its groups of formats 1 to 6 until
                                       they move to the g hash (fields: `state.format`), TTL
                                       max(horizon, judgment TTL); without judgments, under the wall
                                       clock, its newest bucket's TTL
    {ns:P}:g:<query_id>        HASH    the query's groups with their ranked lists, its documents and
                                       segments interned (`state.compact_format`; format 7), TTL
                                       its newest bucket's horizon; written afresh (deleted first)
                                       when its documents' table has grown stale
    {ns:P}:lists:<query_id>:<bucket>  HASH  the query's ranked lists, as positions in their groups
                                       (`state.format`), TTL horizon; since format 7 only for the
                                       groups of earlier formats that are not moved to the g hash
    {ns:P}:imp                 ZSET    impression ids applied, scored by the bucket each is remembered
                                       from (`Engine._impression`); pruned behind the dedup horizon;
                                       since format 8 only read, until pruned
    {ns:P}:iddir               HASH    format 8's impression ids: span (a slot's buckets), <slot> -> its
                                       shard count, <slot>:c -> its ids (`SHARDED_IDS`)
    {ns:P}:ids:<slot>:<i>      HASH    id -> the bucket it is remembered from less the slot's first, for
                                       the ids whose `shard` is i; a slot goes whole behind the dedup
                                       horizon, TTL horizon
    {ns:P}:agg:<bucket>        HASH    aggregate sums (`state.format`), TTL horizon
    {ns:P}:aggidx              ZSET    the buckets that have an agg hash
    {ns:P}:aggchg              ZSET    the same buckets, scored by the next offset of the commit
                                       that last changed them: a scrape reads the buckets changed
                                       since the offset it read last (`read_aggregates`). A commit
                                       that finds aggmark behind the stored offset (a writer of an
                                       earlier version committed without aggchg) bumps aggepoch,
                                       and a reader that sees it move reads the partition whole
    {ns:P}:rows:<bucket>       HASH    drill-down rows (`state.format`), TTL horizon; since format 8
                                       only read, and a row removed when it is written in the shards
    {ns:P}:rowdir:<bucket>     HASH    format 8's rows of the bucket: its shard count, segments
                                       interned (`state.shard_format`), TTL horizon
    {ns:P}:rows:<bucket>:<i>   HASH    the rows of the queries whose `shard` is i, TTL horizon
    {ns:P}:rowlog              STREAM  the rows of each commit (one entry: n its rowseq, r JSON
                                       [[bucket, field, value]...]), trimmed to the last
                                       ROW_LOG_MS, so that a drill-down reader reads what changed;
                                       written only while a reader holds the lease below
    {ns:P}:reader              STRING  a drill-down reader's lease, READER_LEASE_MS: nobody reading,
                                       no log (a reader back later reads the rows whole)
    {ns:P}:exp:<name>          HASH    an experiment's cells and the first bucket the partition counts
                                       (`state.format`; format 6), TTL experiment_retention from each
                                       commit: kept while the experiment is registered, then expired
"""

from __future__ import annotations

from stream_ndcg.state.shard_scripts import SHARDED_IDS, SHARDED_ROWS

# How many buckets' sums one round trip of `read_aggregates` asks for (a bucket is tens of sums).
AGGREGATE_READ_BUCKETS = 1000
# How long the row log keeps a commit's rows: a drill-down reader that comes back later than this
# reads the partition's rows whole again.
ROW_LOG_MS = 120_000
# How long the row log is written after the last drill-down read: an open page refreshes well within it.
READER_LEASE_MS = 600_000

COMMIT = SHARDED_ROWS + SHARDED_IDS + """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if redis.call('HGET', KEYS[2], 'offset') ~= (ARGV[3] ~= '' and ARGV[3] or false) then return -1 end
local p = cjson.decode(ARGV[2])
if redis.call('HGET', KEYS[2], 'aggmark') ~= (ARGV[3] ~= '' and ARGV[3] or false) then
  redis.call('HINCRBY', KEYS[2], 'aggepoch', 1)
end
for _, s in ipairs(p.states) do
  if s[6] then redis.call('DEL', KEYS[s[1]]) end
  for i = 1, #s[3], 200 do redis.call('HSET', KEYS[s[1]], unpack(s[3], i, math.min(i + 199, #s[3]))) end
  for i = 1, #s[4], 200 do redis.call('HDEL', KEYS[s[1]], unpack(s[4], i, math.min(i + 199, #s[4]))) end
  for _, a in ipairs(s[5]) do
    local held = redis.call('HGET', KEYS[s[1]], a[1])
    local list = held and (string.sub(held, 1, -2) .. ',' .. a[2] .. ']') or ('[' .. a[2] .. ']')
    redis.call('HSET', KEYS[s[1]], a[1], list)
  end
  redis.call('PEXPIRE', KEYS[s[1]], s[2])
end
for _, s in ipairs(p.lists) do
  for _, f in ipairs(s[3]) do redis.call('HINCRBY', KEYS[s[1]], f[1], f[2]) end
  redis.call('PEXPIRE', KEYS[s[1]], s[2])
end
for i = 1, #p.impressions, 500 do
  redis.call('ZADD', KEYS[5], unpack(p.impressions, i, math.min(i + 499, #p.impressions)))
end
if #p.impressions > 0 then redis.call('PEXPIRE', KEYS[5], p.imp_ttl) end
if #p.ids > 0 then remember_ids(KEYS[9], p.id_prefix, p.id_span, p.imp_ttl, p.bucket_ms, p.ids) end
for _, a in ipairs(p.aggs) do
  for _, f in ipairs(a[4]) do redis.call('HINCRBYFLOAT', KEYS[a[1]], f[1], f[2]) end
  redis.call('PEXPIRE', KEYS[a[1]], a[2])
  redis.call('ZADD', KEYS[4], a[3], a[3])
  redis.call('ZADD', KEYS[8], p.offset, a[3])
end
for _, r in ipairs(p.rows) do
  if r[5] then
    sharded_rows(KEYS[r[1]], KEYS[r[5]], r[6], r[2], r[3], r[8], r[7], p.bucket_ms)
  else
    for i = 1, #r[3], 200 do redis.call('HSET', KEYS[r[1]], unpack(r[3], i, math.min(i + 199, #r[3]))) end
    redis.call('PEXPIRE', KEYS[r[1]], r[2])
  end
end
if #p.rows > 0 then
  local n = redis.call('HINCRBY', KEYS[2], 'rowseq', 1)
  if redis.call('EXISTS', KEYS[7]) == 1 then
    local now = redis.call('TIME')
    local oldest = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000) - tonumber(p.row_log_ms)
    local logged = {}
    for _, r in ipairs(p.rows) do
      for i = 1, #r[3], 2 do logged[#logged + 1] = {r[4], r[3][i], r[3][i + 1]} end
    end
    redis.call('XADD', KEYS[6], 'MINID', '~', string.format('%d', oldest), '*', 'n', n, 'r', cjson.encode(logged))
    redis.call('PEXPIRE', KEYS[6], p.row_log_ms * 2)
  end
end
local clock = redis.call('HGET', KEYS[2], 'clock')
for _, e in ipairs(p.exps) do
  local from = redis.call('HGET', KEYS[e[1]], 'from')
  if not from then
    from = tonumber(e[2])
    if clock then from = math.max(from, math.floor(tonumber(clock) / p.bucket_ms) + 1) end
    redis.call('HSET', KEYS[e[1]], 'from', string.format('%d', from))
  end
  from = tonumber(from)
  for _, f in ipairs(e[4]) do
    if f[1] >= from then redis.call('HINCRBYFLOAT', KEYS[e[1]], f[2], f[3]) end
  end
  redis.call('PEXPIRE', KEYS[e[1]], e[3])
end
for _, c in ipairs(p.counts) do redis.call('HINCRBY', KEYS[3], c[1], c[2]) end
redis.call('HSET', KEYS[2], 'offset', p.offset, 'aggmark', p.offset)
if p.clock ~= cjson.null then
  local old = redis.call('HGET', KEYS[2], 'clock')
  if not old or tonumber(old) < tonumber(p.clock) then redis.call('HSET', KEYS[2], 'clock', p.clock) end
end
if p.prune ~= cjson.null then
  local gone = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', '(' .. p.prune)
  for i = 1, #gone, 500 do redis.call('ZREM', KEYS[8], unpack(gone, i, math.min(i + 499, #gone))) end
  redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', '(' .. p.prune)
  redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', '(' .. p.forget)
  forget_ids(KEYS[9], p.id_prefix, tonumber(p.forget))
end
return 1
"""

# Records the configuration `adopt` decided on, unless another instance recorded one since it
# read (it then reads and decides again): KEYS config, generation, format; ARGV the configuration
# to record, the one read ('' for none), '1' to start a new generation, the format version to
# record, the versions this release reads (comma-separated).
ADOPT = """
local format = redis.call('GET', KEYS[3])
if format and not string.find(',' .. ARGV[5] .. ',', ',' .. format .. ',', 1, true) then return {-2, format} end
if (redis.call('GET', KEYS[1]) or '') ~= ARGV[2] then return {-1, ''} end
redis.call('SET', KEYS[3], ARGV[4])
redis.call('SET', KEYS[1], ARGV[1])
if ARGV[3] == '1' then return {redis.call('INCR', KEYS[2]), ''} end
return {tonumber(redis.call('GET', KEYS[2]) or '0'), ''}
"""

ADMIT = """
if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 1 then return 1 end
if redis.call('SCARD', KEYS[1]) < tonumber(ARGV[2]) then redis.call('SADD', KEYS[1], ARGV[1]) return 1 end
return 0
"""
