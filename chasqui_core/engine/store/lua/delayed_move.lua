-- Act on one delayed job: run it now, or cancel it.
--
-- KEYS[1] delayed   KEYS[2] stream (the default band's: a prioritised job goes to its
--         band's stream, prelude's band_stream)
-- ARGV[1] "run" (move to the stream now) or "cancel" (remove it)
-- ARGV[2] the member (encoded job) as stored in the delayed set
-- ARGV[3] (cancel) the job's idempotency marker, deleted so its id can be used again
-- Returns the new stream id for "run", 1 for "cancel", or 0 when the member
-- was no longer there (already promoted, run or cancelled).

if redis.call('ZREM', KEYS[1], ARGV[2]) == 0 then
  return 0
end
if ARGV[1] == 'run' then
  return redis.call('XADD', band_stream(KEYS[2], band_of(ARGV[2])), '*', 'j', ARGV[2])
end
if ARGV[3] then
  redis.call('DEL', ARGV[3])
end
return 1
