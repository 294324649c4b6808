"""The Redis key layout of the state, and the Lua scripts that write it.

The scripts are called by `state.redis.RedisStore`, which builds their KEYS and ARGV: a key
added here goes into `RedisStore._payload` too. Format 8's shards are the exception: the script
names them from a prefix and the shard counts it keeps (they share the partition's hash tag, so
its slot on a cluster).

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

# How many buckets' sums one round trip of `read_aggregates` asks for (a bucket is tens of sums).
AGGREGATE_READ_BUCKETS = 1000
# How long the row log keeps a commit's rows: a drill-down reader that comes back later than this
# reads the partition's rows whole again.
ROW_LOG_MS = 120_000
# How long the row log is written after the last drill-down read: an open page refreshes well within it.
READER_LEASE_MS = 600_000

# A shard of a name: the first 32 bits of its SHA-1, modulo the shard count (`shard_format.shard_of`).
# `grow` doubles the shards prefix..0 to prefix..n-1 until they hold at most 64 fields each on
# average, so that each stays a listpack (128 fields at most by the server's defaults): the fields
# are named by what they are sharded by, or (`after_bar`) by it after their first '|'. Doubling
# moves a field of shard i to i or i + n, so each shard's moves are one HSET and one HDEL.
#
# The expiry rule of a slot's or bucket's shards (`expire_shards`): its reference (the rows'
# directory's PTTL; a slot of ids' expiry time, kept in the ids' directory) is re-expired with
# every shard to the commit's TTL and a margin (a bucket) only when fewer than the TTL are left;
# otherwise only the shards this commit created (they had no TTL: a shard doubled into, or one
# written for the first time, which EXISTS told before the writes) take the reference's time
# left. So every shard expires at the reference's time or later, and that is at least the TTL
# after each commit that writes the slot or bucket: what the shards hold is kept at least a TTL
# (a horizon) after its last write, and no shard expires before the others; under the event
# clock the TTL is no fixed point in time, but the reference is re-expired whenever it would end
# too early. A commit that creates no shard and finds the reference far enough re-expires nothing.
SHARD = """
local function shard(name, n)
  return tonumber(string.sub(redis.sha1hex(name), 1, 8), 16) % n
end
local function grow(prefix, n, count, after_bar)
  while count > 64 * n do
    for i = 0, n - 1 do
      local held = redis.call('HGETALL', prefix .. i)
      local moved, names = {}, {}
      for j = 1, #held, 2 do
        local f = held[j]
        if shard(after_bar and string.sub(f, string.find(f, '|', 1, true) + 1) or f, 2 * n) ~= i then
          moved[#moved + 1] = f
          moved[#moved + 1] = held[j + 1]
          names[#names + 1] = f
        end
      end
      for j = 1, #names, 200 do
        redis.call('HSET', prefix .. (i + n), unpack(moved, 2 * j - 1, 2 * math.min(j + 199, #names)))
        redis.call('HDEL', prefix .. i, unpack(names, j, math.min(j + 199, #names)))
      end
    end
    n = 2 * n
  end
  return n
end
-- Whether every one of `touched` (shard -> true) of prefix..<shard> exists, before the writes.
local function all_exist(prefix, touched)
  local names = {}
  for i in pairs(touched) do names[#names + 1] = prefix .. i end
  for j = 1, #names, 200 do
    local chunk = math.min(j + 199, #names)
    if redis.call('EXISTS', unpack(names, j, chunk)) < chunk - j + 1 then return false end
  end
  return true
end
-- The expiry rule above: `left` the reference's ms left (negative: none), the shards were `was`
-- before the commit and `n` after it, `fresh` whether some of `touched` did not exist. Returns the
-- reference's ms left afterwards, or nil when it was not re-expired.
local function expire_shards(prefix, was, n, touched, fresh, left, ttl, margin)
  if left < ttl then
    for i = 0, n - 1 do redis.call('PEXPIRE', prefix .. i, ttl + margin) end
    return ttl + margin
  end
  if fresh then
    for i in pairs(touched) do
      if i < was then redis.call('PEXPIRE', prefix .. i, left) end
    end
  end
  for i = was, n - 1 do redis.call('PEXPIRE', prefix .. i, left) end
  return nil
end
"""

# Format 8's rows of one bucket (`state.shard_format`): its directory `dir` (shard count n, field
# count c, segments interned: k and segment -> index), its shards `prefix`..i, each row cut into
# pieces of at most 64 bytes, the first led by the count; a row of format 7 in `old` is removed.
# The shards double when they hold more than 64 fields each on average, so that each stays a
# listpack; a new bucket starts at the shard count of the bucket before it (`before` its
# directory), so that its rows are seldom moved.
SHARDED_ROWS = SHARD + """
local function sharded_rows(dir, old, prefix, ttl, fields, before, margin)
  local held_n = redis.call('HGET', dir, 'n')
  local n = tonumber(held_n or redis.call('HGET', before, 'n') or '1')
  local stale = redis.call('EXISTS', old) == 1
  local rows, touched = {}, {}
  for i = 1, #fields, 2 do
    local f = fields[i]
    local cut = string.find(f, '\\31', 1, true)
    local segment, q = string.sub(f, 1, cut - 1), string.sub(f, cut + 1)
    local at = shard(q, n)
    touched[at] = true
    rows[#rows + 1] = {segment, q, fields[i + 1], at, f}
  end
  local fresh = not all_exist(prefix, touched)
  -- Each shard's fields in one HSET, each segment's index asked once.
  local indexes, by_shard = {}, {}
  for _, row in ipairs(rows) do
    local segment, q, text = row[1], row[2], row[3]
    local index = indexes[segment] or redis.call('HGET', dir, segment)
    if not index then
      index = tostring(redis.call('HINCRBY', dir, 'k', 1) - 1)
      redis.call('HSET', dir, segment, index)
    end
    indexes[segment] = index
    local m = math.ceil((#text + 1) / 64)
    local args = by_shard[row[4]] or {}
    by_shard[row[4]] = args
    args[#args + 1] = index .. '|' .. q
    args[#args + 1] = string.char(48 + m) .. string.sub(text, 1, 63)
    for j = 1, m - 1 do
      args[#args + 1] = index .. '~' .. j .. '|' .. q
      args[#args + 1] = string.sub(text, 64 * j, 64 * j + 63)
    end
    if stale then redis.call('HDEL', old, row[5]) end
  end
  local added = 0
  for at, args in pairs(by_shard) do
    for j = 1, #args, 200 do added = added + redis.call('HSET', prefix .. at, unpack(args, j, math.min(j + 199, #args))) end
  end
  local grown = grow(prefix, n, redis.call('HINCRBY', dir, 'c', added), true)
  if grown ~= n or not held_n then redis.call('HSET', dir, 'n', grown) end
  if expire_shards(prefix, n, grown, touched, fresh, redis.call('PTTL', dir), ttl, margin) then
    redis.call('PEXPIRE', dir, ttl + margin)
  end
end
"""

# Format 8's impression ids (`state.shard_format`): the directory `dir` (span: the buckets of a
# slot, fixed at the first write; <slot> -> its shard count; <slot>:c its ids; <slot>:x the time
# (ms, the server's clock) its shards expire at the earliest: the reference of `expire_shards`),
# the shards prefix..<slot>:<i>, id -> its bucket less the slot's first. A new slot starts at the
# shard count of the slot before it, so that its ids are seldom moved.
SHARDED_IDS = """
local function remember_ids(dir, prefix, span, ttl, margin, ids)
  local held_span = redis.call('HGET', dir, 'span')
  if held_span then span = tonumber(held_span) else redis.call('HSET', dir, 'span', span) end
  local slots, order = {}, {}
  for i = 1, #ids, 2 do
    local bucket = tonumber(ids[i])
    local start = bucket - bucket % span
    local slot = slots[start]
    if not slot then
      local held = redis.call('HMGET', dir, start, start .. ':x', start - span)
      slot = {n = tonumber(held[1] or held[3] or '1'), known = held[1], until_ms = tonumber(held[2] or '0'),
              added = 0, touched = {}, writes = {}}
      slots[start] = slot
      order[#order + 1] = start
    end
    local at = shard(ids[i + 1], slot.n)
    local args = slot.writes[at] or {}
    slot.writes[at] = args
    slot.touched[at] = true
    args[#args + 1] = ids[i + 1]
    args[#args + 1] = bucket - start
  end
  local now = redis.call('TIME')
  now = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
  for _, start in ipairs(order) do
    local slot = slots[start]
    local slot_prefix = prefix .. start .. ':'
    local fresh = not all_exist(slot_prefix, slot.touched)
    for at, args in pairs(slot.writes) do
      for j = 1, #args, 200 do
        slot.added = slot.added + redis.call('HSET', slot_prefix .. at, unpack(args, j, math.min(j + 199, #args)))
      end
    end
    local n = grow(slot_prefix, slot.n, redis.call('HINCRBY', dir, start .. ':c', slot.added), false)
    if n ~= slot.n or not slot.known then redis.call('HSET', dir, start, n) end
    local left = expire_shards(slot_prefix, slot.n, n, slot.touched, fresh, slot.until_ms - now, ttl, margin)
    if left then redis.call('HSET', dir, start .. ':x', now + left) end
  end
  redis.call('PEXPIRE', dir, ttl + margin)
end
local function forget_ids(dir, prefix, before)
  local held = redis.call('HGETALL', dir)
  local span = tonumber(redis.call('HGET', dir, 'span') or '0')
  for i = 1, #held, 2 do
    local f = held[i]
    if f ~= 'span' and not string.find(f, ':', 1, true) and tonumber(f) + span <= before then
      for s = 0, tonumber(held[i + 1]) - 1 do redis.call('DEL', prefix .. f .. ':' .. s) end
      redis.call('HDEL', dir, f, f .. ':c', f .. ':x')
    end
  end
end
"""

# Which of ARGV[2...] (impression ids) format 8's shards hold (KEYS[1] their directory, ARGV[1]
# their prefix): each id's bucket, or nil. The slots are tried newest first, each with one HMGET
# per shard for the ids not found yet.
SEEN_IDS = SHARD + """
local held = redis.call('HGETALL', KEYS[1])
local slots = {}
for i = 1, #held, 2 do
  if held[i] ~= 'span' and not string.find(held[i], ':', 1, true) then
    slots[#slots + 1] = {held[i], tonumber(held[i + 1]), tonumber(held[i])}
  end
end
table.sort(slots, function(a, b) return a[3] > b[3] end)
local found, pending = {}, {}
for j = 2, #ARGV do
  found[j - 1] = false
  -- shard(id, n) for every slot's n, the digest taken once.
  pending[#pending + 1] = {j - 1, shard(ARGV[j], 4294967296)}
end
for _, slot in ipairs(slots) do
  if #pending == 0 then break end
  local by_shard = {}
  for _, p in ipairs(pending) do
    local at = p[2] % slot[2]
    local group = by_shard[at]
    if not group then group = {}; by_shard[at] = group end
    group[#group + 1] = p
  end
  local left = {}
  for at, group in pairs(by_shard) do
    local names = {}
    for k, p in ipairs(group) do names[k] = ARGV[p[1] + 1] end
    for k = 1, #names, 200 do
      local got = redis.call('HMGET', ARGV[1] .. slot[1] .. ':' .. at, unpack(names, k, math.min(k + 199, #names)))
      for m = 1, #got do
        local p = group[k + m - 1]
        if got[m] then found[p[1]] = slot[3] + tonumber(got[m]) else left[#left + 1] = p end
      end
    end
  end
  pending = left
end
return found
"""

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
    sharded_rows(KEYS[r[1]], KEYS[r[5]], r[6], r[2], r[3], r[7], p.bucket_ms)
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
