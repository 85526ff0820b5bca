-- Move due jobs from the delayed set to the stream, using the server's clock.
-- ZRANGEBYSCORE, XADD and ZREMRANGEBYRANK run in one atomic call, so two promoters can
-- never move the same entry twice.
--
-- KEYS[1] delayed   KEYS[2] stream   KEYS[3] events   KEYS[4] promoter lock
--         (KEYS[2] is the default band's stream: a job with a priority goes to its
--         band's stream, prelude's band_of and band_stream)
-- ARGV[1] lock holder id; when not "" the call moves nothing unless this
--         holder owns the lock (a deposed leader stops at once)
-- ARGV[2] most entries to move in this call
-- ARGV[3] prefix of the metrics counters ({chasqui:<q>}:m:)
-- ARGV[4] approximate cap of the events stream
-- Returns {moved, score of the earliest entry still waiting or -1, server ms, -1 when not the leader}
--
-- Calls server_ms and bump_counters from prelude.lua.

local delayed, stream, events, lock = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local holder, limit, mprefix, evcap = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4]
local now = server_ms()
if holder ~= '' and redis.call('GET', lock) ~= holder then
  return {0, -1, now, -1}
end
local due = redis.call('ZRANGEBYSCORE', delayed, '-inf', now, 'LIMIT', 0, limit)
local moved = #due
if moved > 0 then
  for k = 1, moved do
    redis.call('XADD', band_stream(stream, band_of(due[k])), '*', 'j', due[k])
  end
  -- the due entries are the lowest-scored: ranks 0 .. moved-1, removed by rank
  -- in one call, cheaper than looking each member up again with ZREM
  redis.call('ZREMRANGEBYRANK', delayed, 0, moved - 1)
  local depth = redis.call('ZCARD', delayed)
  redis.call('XADD', events, 'MAXLEN', '~', evcap, '*', 'type', 'promoted', 'count', moved, 'depth', depth)
  bump_counters(mprefix, now, {'promoted', moved})
end
local nxt = redis.call('ZRANGE', delayed, 0, 0, 'WITHSCORES')
local next_due = -1
if #nxt > 0 then next_due = tonumber(nxt[2]) end
return {moved, next_due, now, 1}
