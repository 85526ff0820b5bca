-- Claim a DLQ operation (a replay or discard by filter) for one runner.
--
-- A pending operation is taken at once; a running one only once its owner
-- has been silent longer than the stale time (that runner died, and this one
-- carries on from the operation's cursor). A finished or missing operation
-- leaves the pending set, so runners stop looking at it.
--
-- KEYS[1] the operation's hash   KEYS[2] the queue's set of unfinished operations
-- ARGV[1] runner id   ARGV[2] stale after (ms)   ARGV[3] operation id (its member in KEYS[2])
-- Returns 1 when the caller now owns the operation, 0 when another runner holds it, -1 when it is finished or gone.

local op, pending = KEYS[1], KEYS[2]
local state = redis.call('HGET', op, 'state')
if not state or (state ~= 'pending' and state ~= 'running') then
  redis.call('ZREM', pending, ARGV[3])
  return -1
end
local now = server_ms()
if state == 'running' then
  local beat = tonumber(redis.call('HGET', op, 'heartbeat') or '0') or 0
  if now - beat <= tonumber(ARGV[2]) then
    return 0
  end
end
redis.call('HSET', op, 'state', 'running', 'owner', ARGV[1], 'heartbeat', now)
redis.call('HSETNX', op, 'started_ms', now)
redis.call('HINCRBY', op, 'claims', 1)
return 1
