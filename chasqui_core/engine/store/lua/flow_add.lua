-- Add children to a batch while one of its children runs (the fan-out
-- pattern), in one atomic call: the batch's total grows with the jobs it
-- adds, so it cannot be complete before they are.
--
-- KEYS[1] the queue's default stream ({chasqui:<q>}:stream)
-- ARGV[1] prefix of the queue's counters ({chasqui:<q>}:m:)
-- ARGV[2] the batch id
-- ARGV[3] the job id of the running child that adds them
-- ARGV[4] the new children: one msgpack array of pairs laid flat: job id, envelope
-- Returns the number of jobs added; an error reply when the batch is unknown
-- (expired) or has counted the adding child's end already.
--
-- Calls server_ms, bump_counters, band_of and band_stream from prelude.lua;
-- flow_key from flows.lua.

local stream, mprefix, flow, parent = KEYS[1], ARGV[1], ARGV[2], ARGV[3]
local key = flow_key(stream, flow)
if not redis.call('HGET', key, 'total') then
  return redis.error_reply('batch ' .. flow .. ' is unknown or has expired')
end
if redis.call('HEXISTS', key, 'k:' .. parent) == 1 then
  return redis.error_reply('job ' .. parent .. ' has ended in batch ' .. flow .. ': only a running child adds children')
end
local items = cmsgpack.unpack(ARGV[4])
local kids = {}
for k = 1, #items, 2 do
  kids[#kids + 1] = items[k]
  redis.call('XADD', band_stream(stream, band_of(items[k + 1])), '*', 'j', items[k + 1])
end
if #kids > 0 then
  redis.call('HINCRBY', key, 'total', #kids)
  call_in_chunks('RPUSH', key .. ':kids', kids, 4000)
  bump_counters(mprefix, server_ms(), {'enqueued', #kids})
end
return #kids
