-- One worker's lease pass on one queue: say it is alive, keep the entries it
-- holds, forget journal marks it no longer needs, and find entries of its
-- own that it does not hold.
--
-- 1. SET alive PX ttl: while this key lives, no other worker takes this
--    worker's entries (reclaim.lua), however long they sit idle. A live but
--    busy worker is never mistaken for a dead one.
-- 2. Each held entry is renewed (XCLAIM JUSTID resets its idle time without
--    counting a delivery), only while the pending list still names this
--    consumer as its owner: renewing blindly would take back an entry that
--    was already reclaimed, and its job would run twice.
-- 3. The start journal (running hash) keeps only held entries: a mark whose
--    HSET reached the server after its settle.lua HDEL is removed here.
-- 4. Entries pending on this consumer, idle at least ARGV[4] ms (renewed ones
--    are not) and not held, were read but never taken in (a reply lost with
--    its connection, say): they are returned with their fields, to be taken
--    in now rather than left pending.
--
-- KEYS[1] stream   KEYS[2] this worker's alive key   KEYS[3] its running hash (the start journal)
-- ARGV[1] consumer group   ARGV[2] this consumer   ARGV[3] alive ttl ms
-- ARGV[4] idle ms after which an unheld entry of this consumer is an orphan
-- ARGV[5] most orphans to return   ARGV[6..] entry ids held
-- Returns {ids no longer this consumer's, flat list of orphans: id, fields (array)}

local stream, alive, running = KEYS[1], KEYS[2], KEYS[3]
local group, me = ARGV[1], ARGV[2]
redis.call('SET', alive, '1', 'PX', ARGV[3])

local held, lost = {}, {}
for i = 6, #ARGV do
  local id = ARGV[i]
  held[id] = true
  local p = redis.call('XPENDING', stream, group, id, id, 1)
  if #p > 0 and p[1][2] == me then
    redis.call('XCLAIM', stream, group, me, 0, id, 'JUSTID')
  else
    lost[#lost + 1] = id
  end
end

local marks = redis.call('HKEYS', running)
for _, id in ipairs(marks) do
  if not held[id] then redis.call('HDEL', running, id) end
end

local orphans = {}
local pending = redis.call('XPENDING', stream, group, 'IDLE', ARGV[4], '-', '+', ARGV[5], me)
for _, p in ipairs(pending) do
  local id = p[1]
  if not held[id] then
    local e = redis.call('XRANGE', stream, id, id)
    if #e == 0 then
      redis.call('XACK', stream, group, id)  -- deleted while pending: nothing to run
    else
      orphans[#orphans + 1] = id
      orphans[#orphans + 1] = e[1][2]
    end
  end
end
return {lost, orphans}
