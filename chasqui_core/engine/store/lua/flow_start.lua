-- Start a workflow in one atomic call: write its batches (their counts,
-- children and callbacks, see flows.lua) and add the jobs that run first, so
-- no child can end before its batch exists and no batch waits for a child that
-- was never added. A re-sent call (its reply lost) adds nothing.
--
-- KEYS[1] the queue's default stream ({chasqui:<q>}:stream); every key written
--         carries its hash tag
-- ARGV[1] prefix of the queue's counters ({chasqui:<q>}:m:)
-- ARGV[2] how long a batch's keys are kept after their last change, in ms
-- ARGV[3] the batches, one msgpack array of triples laid flat: batch id, array
--         of its children's job ids in order, array of hash fields and values
--         laid flat (its callbacks, its place in a chain)
-- ARGV[4] the jobs to add now, one msgpack array of envelopes (each goes to its
--         priority band's stream, prelude's band_stream)
-- Counts the jobs in `enqueued` and the batches (a chain's steps each) in
-- `batches_started`, in the queue's counters.
-- Returns the number of jobs added, or -1 when the first batch exists already
-- (the call was applied before).
--
-- Calls server_ms, bump_counters, band_of and band_stream from prelude.lua;
-- flow_key and flow_fire from flows.lua.

local stream, mprefix, ttl = KEYS[1], ARGV[1], tonumber(ARGV[2])
local batches = cmsgpack.unpack(ARGV[3])
local jobs = cmsgpack.unpack(ARGV[4])
if #batches > 0 and redis.call('EXISTS', flow_key(stream, batches[1])) == 1 then
  return -1
end
local empty = {}
for b = 1, #batches, 3 do
  local key = flow_key(stream, batches[b])
  local kids, fields = batches[b + 1], batches[b + 2]
  redis.call('HSET', key, 'total', #kids, 'ok', 0, 'dead', 0, 'gone', 0, 'stream', stream, 'metrics', mprefix,
    'ttl', ttl, 'created', server_ms())
  if #fields > 0 then
    call_in_chunks('HSET', key, fields, 4000)
  end
  if #kids > 0 then
    call_in_chunks('RPUSH', key .. ':kids', kids, 4000)
    redis.call('PEXPIRE', key .. ':kids', ttl)
  else
    empty[#empty + 1] = key
  end
  redis.call('PEXPIRE', key, ttl)
end
for k = 1, #jobs do
  redis.call('XADD', band_stream(stream, band_of(jobs[k])), '*', 'j', jobs[k])
end
bump_counters(mprefix, server_ms(), {'enqueued', #jobs, 'batches_started', #batches / 3})
for k = 1, #empty do
  flow_fire(empty[k], 'success')
  flow_fire(empty[k], 'complete')
end
return #jobs
