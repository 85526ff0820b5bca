-- Count a queue's delayed jobs, and how many are already due, by the server's
-- clock. ZCOUNT needs "now" as an argument, and only a script can read TIME
-- and use it in the same call, so an inspector never compares the server's
-- scores against its own (possibly skewed) clock.
--
-- KEYS[1] delayed
-- Returns {server ms, delayed entries, entries due (score <= server ms),
--          lowest score or -1 when the set is empty}
--
-- Calls server_ms from prelude.lua.

local now = server_ms()
local size = redis.call('ZCARD', KEYS[1])
if size == 0 then
  return {now, 0, 0, -1}
end
local overdue = redis.call('ZCOUNT', KEYS[1], '-inf', now)
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return {now, size, overdue, tonumber(first[2])}
