-- Ask for a job to be cancelled: note the request in the queue's cancel
-- record, and move the job out of the delayed set to the stream when it waits
-- there, so a worker refuses it at once (dead-lettered as `cancelled`) rather
-- than at its due time. The record is written first, in the same call: a
-- worker that reads the entry sees it.
--
-- KEYS[1] the cancel record ({chasqui:<q>}:cancel, a hash job id -> requested ms)
-- KEYS[2] delayed   KEYS[3] stream (the default band's; a prioritised job goes to its band's)
-- KEYS[4] the record's version ({chasqui:<q>}:cancel:v), bumped: readers keep a copy of the record per version
-- ARGV[1] job id
-- ARGV[2] the job's member in the delayed set as stored, or "" when it was not found there
-- Returns {server ms, "delayed" when the member was moved to the stream, else "requested"}
--
-- Calls server_ms from prelude.lua.

local now = server_ms()
redis.call('HSET', KEYS[1], ARGV[1], now)
redis.call('INCR', KEYS[4])
if ARGV[2] ~= '' and redis.call('ZREM', KEYS[2], ARGV[2]) == 1 then
  redis.call('XADD', band_stream(KEYS[3], band_of(ARGV[2])), '*', 'j', ARGV[2])
  return {now, 'delayed'}
end
return {now, 'requested'}
