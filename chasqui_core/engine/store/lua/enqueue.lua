-- Add a chunk of jobs to a queue in one call; a re-sent call adds nothing.
-- (A single plain job, the most common add, goes through enqueue_plain.lua.)
--
-- KEYS[1]  stream   {chasqui:<q>}:stream
-- KEYS[2]  delayed  {chasqui:<q>}:delayed
-- KEYS[3]  lane     {chasqui:<q>}:lane:<lane id>: the last write of one
--                   producer lane, as "<seq>:<msgpack of its reply>"
-- ARGV[1]  prefix of idempotency markers ({chasqui:<q>}:unique:)
-- ARGV[2]  idempotency window in ms
-- ARGV[3]  prefix of the metrics counters ({chasqui:<q>}:m:)
-- ARGV[4]  how long a lane remembers its last write, in ms
-- ARGV[5]  this write's sequence number in its lane (fixed before the first try)
-- ARGV[6]  "1" when the write is sent again after a try whose reply was lost,
--          "" on its first try (which cannot find its own number: not read)
-- ARGV[7]  the jobs, one msgpack array of triples laid flat (one argument per
--          chunk instead of three per job keeps the call cheap to send):
--          job id ("" when the caller gave none), when, payload
--            when = ""      -> ready now (XADD)
--                   "!<band>" -> ready now, in a priority band's stream
--                              ("!high", "!low": prelude's band_stream)
--                   "+<ms>" -> delayed by ms from the server's clock (ZADD)
--                   "@<ms>" -> delayed until an absolute epoch ms (ZADD)
--          a delayed job's mark ({chasqui:<q>}:djob:<job id>) is written with it
-- A caller-given id's marker ({chasqui:<q>}:unique:<id>, set NX for the
-- window) names the stream entry its job was added at, "<band> <entry id>"
-- (band "" for the queue's own stream), so lookup.py finds the job there
-- without reading the stream; a delayed job's marker holds "1" (its delayed
-- mark names where it is).
-- Returns: one entry per job: the stream id, "delayed", or 0 when a job with
-- the same caller-given id was added within the idempotency window. A call
-- whose lane already holds its sequence number was applied before (its reply
-- was lost): it changes nothing and returns that first reply again.
--
-- Calls server_ms, bump_counters and mark_delayed from prelude.lua.

local stream, delayed, lane = KEYS[1], KEYS[2], KEYS[3]
local unique_prefix, unique_ttl, mprefix, lane_ttl, seq = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
if ARGV[6] ~= '' then
  local last = redis.call('GET', lane)
  if last and string.sub(last, 1, #seq + 1) == seq .. ':' then
    return cmsgpack.unpack(string.sub(last, #seq + 2))
  end
end
local now = server_ms()
local out = {}
local added = 0
local items = cmsgpack.unpack(ARGV[7])
for i = 1, #items, 3 do
  local id, when, payload = items[i], items[i + 1], items[i + 2]
  local fresh = true
  if id ~= '' then
    fresh = redis.call('SET', unique_prefix .. id, '1', 'NX', 'PX', unique_ttl)
  end
  if not fresh then
    out[#out + 1] = 0
  elseif when == '' or string.byte(when, 1) == 33 then
    local band = string.sub(when, 2)
    local entry = redis.call('XADD', band_stream(stream, band), '*', 'j', payload)
    if id ~= '' then
      redis.call('SET', unique_prefix .. id, band .. ' ' .. entry, 'KEEPTTL')
    end
    out[#out + 1] = entry
    added = added + 1
  else
    local at
    if string.sub(when, 1, 1) == '+' then
      at = now + tonumber(string.sub(when, 2))
    else
      at = tonumber(string.sub(when, 2))
    end
    redis.call('ZADD', delayed, at, payload)
    mark_delayed(delayed, payload, at, now)
    out[#out + 1] = 'delayed'
    added = added + 1
  end
end
bump_counters(mprefix, now, {'enqueued', added})
redis.call('SET', lane, seq .. ':' .. cmsgpack.pack(out), 'PX', lane_ttl)
return out
