-- Record what the scheduler fired for one schedule and move its next due time,
-- only for the leader, and only from the state it read (compare-and-set).
--
-- KEYS[1]  the scheduler's lock ({chasqui:schedules}:lock)
-- KEYS[2]  the schedule's state hash ({chasqui:schedules}:state:<name>)
-- KEYS[3]  the schedule's recent fires ({chasqui:schedules}:fires:<name>)
-- ARGV[1]  holder id: the lock must hold it ("" skips the check: a fire by hand)
-- ARGV[2]  the next due time the caller read ("" when it starts the schedule
--          afresh: a new or changed definition)
-- ARGV[3]  the new next due time (epoch ms; "" keeps it)
-- ARGV[4]  the definition's version the due times were computed for ("" keeps it)
-- ARGV[5]  due times missed (no job) to add to the schedule's count
-- ARGV[6]  how many fire records to keep
-- ARGV[7..] fire records, oldest first: JSON strings, pushed to the front of
--          the list; the last one is also written as the state's last fire;
--          the scheduler's own (holder given) add to the state's 'fired' count
-- Returns 1 when applied; 0 when the caller is not the leader; -1 when the
-- next due time is not the one the caller read (another leader moved it).

local lock, state, fires = KEYS[1], KEYS[2], KEYS[3]
local holder, expected, next_due, version = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
if holder ~= '' and redis.call('GET', lock) ~= holder then
  return 0
end
if expected ~= '' and redis.call('HGET', state, 'next') ~= expected then
  return -1
end
if next_due ~= '' then
  redis.call('HSET', state, 'next', next_due)
end
if version ~= '' then
  redis.call('HSET', state, 'version', version)
end
local missed = tonumber(ARGV[5])
if missed > 0 then
  redis.call('HINCRBY', state, 'missed', missed)
end
if #ARGV >= 7 then
  for i = 7, #ARGV do
    redis.call('LPUSH', fires, ARGV[i])
  end
  redis.call('HSET', state, 'last', ARGV[#ARGV])
  if holder ~= '' then
    redis.call('HINCRBY', state, 'fired', #ARGV - 6)
  end
  redis.call('LTRIM', fires, 0, tonumber(ARGV[6]) - 1)
end
return 1
