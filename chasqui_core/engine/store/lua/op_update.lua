-- Write a DLQ operation's progress, or its end, as long as the caller still owns it.
--
-- Every write is also the owner's heartbeat. A runner that lost the operation
-- (it was silent too long and another runner claimed it) writes nothing and
-- learns it must stop. A final state takes the operation out of the pending
-- set and lets its hash expire; "pending" gives it back, to be claimed at once
-- by any runner (a worker stopping mid-way).
--
-- KEYS[1] the operation's hash   KEYS[2] the queue's set of unfinished operations
-- ARGV[1] runner id   ARGV[2] state: running | pending | done | cancelled | failed
-- ARGV[3] operation id   ARGV[4] seconds to keep a finished operation's hash
-- ARGV[5..] field, value pairs to set (done, count, cursor, ...)
-- Returns 1 when written and a cancel has been asked, 0 when written, -1 when the caller does not own it.

local op, pending = KEYS[1], KEYS[2]
if redis.call('HGET', op, 'owner') ~= ARGV[1] or redis.call('HGET', op, 'state') ~= 'running' then
  return -1
end
local now = server_ms()
local state = ARGV[2]
if #ARGV > 4 then
  redis.call('HSET', op, unpack(ARGV, 5))
end
if state == 'running' then
  redis.call('HSET', op, 'heartbeat', now)
elseif state == 'pending' then
  redis.call('HSET', op, 'state', 'pending', 'owner', '', 'heartbeat', 0)
else
  redis.call('HSET', op, 'state', state, 'heartbeat', now, 'finished_ms', now)
  redis.call('ZREM', pending, ARGV[3])
  redis.call('EXPIRE', op, tonumber(ARGV[4]))
end
if redis.call('HGET', op, 'cancel') == '1' then
  return 1
end
return 0
