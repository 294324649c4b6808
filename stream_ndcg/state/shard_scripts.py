"""The Lua of state format 8's shards (`state.shard_format`): the commit script's parts that write
drill-down rows and impression ids in listpack-sized shards, and the script that looks the ids up.

`redis_scripts.COMMIT` is built with `SHARDED_ROWS` and `SHARDED_IDS`; `state.redis.RedisStore`
calls `SEEN_IDS`. The shards are named by the scripts from a prefix and the shard counts they
keep (they share the partition's hash tag, so its slot on a cluster).
"""

from __future__ import annotations

# A shard of a name: the first 32 bits of its SHA-1, modulo the shard count (`shard_format.shard_of`).
# `grow` doubles the shards prefix..0 to prefix..n-1 until they hold at most 64 fields each on
# average, so that each stays a listpack (128 fields at most by the server's defaults): the fields
# are named by what they are sharded by, or (`after_bar`) by it after their first '|'. It moves
# each field once, to its shard among the final count, each shard's moves in one HSET a shard
# moved to and one HDEL.
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
  local to_n = n
  while count > 64 * to_n do to_n = 2 * to_n end
  if to_n == n then return n end
  for i = 0, n - 1 do
    local held = redis.call('HGETALL', prefix .. i)
    local moved, names = {}, {}
    for j = 1, #held, 2 do
      local f = held[j]
      local to = shard(after_bar and string.sub(f, string.find(f, '|', 1, true) + 1) or f, to_n)
      if to ~= i then
        local fields = moved[to] or {}
        moved[to] = fields
        fields[#fields + 1] = f
        fields[#fields + 1] = held[j + 1]
        names[#names + 1] = f
      end
    end
    for to, fields in pairs(moved) do
      for j = 1, #fields, 200 do redis.call('HSET', prefix .. to, unpack(fields, j, math.min(j + 199, #fields))) end
    end
    for j = 1, #names, 200 do redis.call('HDEL', prefix .. i, unpack(names, j, math.min(j + 199, #names))) end
  end
  return to_n
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
# pieces of at most 64 bytes, the first led by the count, `hashes` the `shard_format.name_hash` of
# each row's query; a row of format 7 in `old` is removed.
# The shards double when they hold more than 64 fields each on average, so that each stays a
# listpack; a new bucket starts at the shard count of the bucket before it (`before` its
# directory), so that its rows are seldom moved.
SHARDED_ROWS = SHARD + """
local function sharded_rows(dir, old, prefix, ttl, fields, hashes, before, margin)
  local held_n = redis.call('HGET', dir, 'n')
  local n = tonumber(held_n or redis.call('HGET', before, 'n') or '1')
  local stale = redis.call('EXISTS', old) == 1
  local rows, touched = {}, {}
  for i = 1, #fields, 2 do
    local f = fields[i]
    local cut = string.find(f, '\\31', 1, true)
    local segment, q = string.sub(f, 1, cut - 1), string.sub(f, cut + 1)
    local at = hashes[(i + 1) / 2] % n
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
    for j = 1, #args, 200 do
      added = added + redis.call('HSET', prefix .. at, unpack(args, j, math.min(j + 199, #args)))
    end
  end
  local grown = grow(prefix, n, redis.call('HINCRBY', dir, 'c', added), true)
  if grown ~= n or not held_n then redis.call('HSET', dir, 'n', grown) end
  -- The directory first: a shard's relative expiry, set after it, cannot fall a millisecond short.
  local left = redis.call('PTTL', dir)
  if left < ttl then redis.call('PEXPIRE', dir, ttl + margin) end
  expire_shards(prefix, n, grown, touched, fresh, left, ttl, margin)
end
"""

# Format 8's impression ids (`state.shard_format`), `ids` as bucket, id, its `shard_format.name_hash`
# (the first 32 bits of its SHA-1, which `shard` would take) ...: the directory `dir` (span: the
# buckets of a slot, fixed at the first write; <slot> -> its shard count; <slot>:c its ids; <slot>:x the time
# (ms, the server's clock) its shards expire at the earliest: the reference of `expire_shards`),
# the shards prefix..<slot>:<i>, id -> its bucket less the slot's first. A new slot starts at the
# shard count of the slot before it, so that its ids are seldom moved.
SHARDED_IDS = """
local function remember_ids(dir, prefix, span, ttl, margin, ids)
  local held_span = redis.call('HGET', dir, 'span')
  if held_span then span = tonumber(held_span) else redis.call('HSET', dir, 'span', span) end
  local slots, order = {}, {}
  for i = 1, #ids, 3 do
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
    local at = ids[i + 2] % slot.n
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

# Which of ARGV[2, 4, ...] (impression ids, each followed by its `shard_format.name_hash`) format
# 8's shards hold (KEYS[1] their directory, ARGV[1] their prefix): each id's bucket, or nil. The
# slots are tried newest first, each with one HMGET per shard for the ids not found yet.
SEEN_IDS = """
local held = redis.call('HGETALL', KEYS[1])
local slots = {}
for i = 1, #held, 2 do
  if held[i] ~= 'span' and not string.find(held[i], ':', 1, true) then
    slots[#slots + 1] = {held[i], tonumber(held[i + 1]), tonumber(held[i])}
  end
end
table.sort(slots, function(a, b) return a[3] > b[3] end)
local found, pending = {}, {}
for j = 2, #ARGV, 2 do
  found[j / 2] = false
  if #slots > 0 then pending[#pending + 1] = {j / 2, tonumber(ARGV[j + 1])} end
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
    for k, p in ipairs(group) do names[k] = ARGV[2 * p[1]] end
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
