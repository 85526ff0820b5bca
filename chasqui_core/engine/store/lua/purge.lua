-- Empty a queue of its waiting jobs, one chunk per call: the entries of the
-- stream that no worker was handed yet.
--
-- Those are the entries after the consumer group's last-delivered id. Entries
-- at or before it are pending in a worker (its PEL): they are left alone, so
-- what a worker holds runs and is settled as usual. Reading the last-delivered
-- id inside the call makes the chunk atomic against readers: no entry is
-- deleted after it was delivered. Deleted entries are counted as `purged` in
-- the queue's counters (per second, per minute, all-time) in the same call.
--
-- KEYS[1] stream (the queue's own, or one of its priority bands': purge.py calls this per band)
-- KEYS[2] the queue's counters prefix ({chasqui:<q>}:m:)
-- ARGV[1] consumer group name   ARGV[2] most entries to delete in this call
-- ARGV[3] the newest entry id to delete ('+': any), so entries added after a purge began are kept
-- Returns {deleted, more}: more is 1 when waiting entries may be left past this chunk.

local stream, group, limit = KEYS[1], ARGV[1], tonumber(ARGV[2])
if redis.call('EXISTS', stream) == 0 then
  return {0, 0}
end
local last = '0-0'
for _, g in ipairs(redis.call('XINFO', 'GROUPS', stream)) do
  local name, delivered
  for i = 1, #g, 2 do
    if g[i] == 'name' then name = g[i + 1] elseif g[i] == 'last-delivered-id' then delivered = g[i + 1] end
  end
  if name == group then last = delivered end
end
local entries = redis.call('XRANGE', stream, '(' .. last, ARGV[3], 'COUNT', limit)
if #entries == 0 then
  return {0, 0}
end
local ids = {}
for i, e in ipairs(entries) do
  ids[i] = e[1]
end
local deleted = redis.call('XDEL', stream, unpack(ids))
bump_counters(KEYS[2], server_ms(), {'purged', deleted})
return {deleted, #entries == limit and 1 or 0}
