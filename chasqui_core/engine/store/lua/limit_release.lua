-- Give back the concurrency slots of runs that ended, and wake one parked job
-- per slot given back: it is due now in the delayed set instead of when the
-- oldest slot would have lapsed, and leaves its bucket's waiting set.
--
-- A parked job may have been promoted already (its due time came first); the
-- delayed set no longer holds it then, ZADD XX changes nothing, and the next
-- parked job is tried.
--
-- KEYS[1] delayed
-- ARGV pairs: key prefix of a concurrency bucket ({chasqui:<q>}:limit:<scope>:<bucket>:), the run's member
--            (its stream id, after "<band>:" for a priority band's stream: limits.slot_member)
-- Returns {slots given back, jobs woken}
--
-- A woken job's mark is moved to its new score with it.
--
-- Calls server_ms and mark_delayed from prelude.lua.

local delayed = KEYS[1]
local released, woken = 0, 0
local now = server_ms()
for i = 1, #ARGV, 2 do
  local prefix, id = ARGV[i], ARGV[i + 1]
  if redis.call('ZREM', prefix .. 'running', id) == 1 then
    released = released + 1
    while true do
      local next_up = redis.call('ZPOPMIN', prefix .. 'parked')
      if #next_up == 0 then break end
      local member = next_up[1]
      local space = string.find(member, ' ', 1, true)
      redis.call('ZREM', prefix .. 'waiting', string.sub(member, 1, space - 1))
      local payload = string.sub(member, space + 1)
      if redis.call('ZADD', delayed, 'XX', 'CH', now, payload) == 1 then
        mark_delayed(delayed, payload, now, now)
        woken = woken + 1
        break
      end
    end
  end
end
return {released, woken}
