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
--    was already reclaimed, and its job would run twice. A held entry
--    pending on another consumer was taken back (claimed). One no longer
--    pending at all was either settled meanwhile (the held list includes
--    outcomes the settler is flushing) or put back by a reclaim while this
--    worker was silent: reclaim.lua notes the ids it takes in the worker's
--    taken set, so only those are returned with the claimed ones. The set is
--    then emptied: every id in it that this worker still holds was in the
--    held list.
-- 3. A start journal mark (running hash) of an entry no longer pending on
--    this consumer is removed: its HSET reached the server after the
--    settle.lua HDEL. Marks of pending entries stay, held or not: one may be
--    newer than the held list this call was given.
-- 4. Entries pending on this consumer, idle at least ARGV[4] ms (renewed ones
--    are not) and not held, were read but never taken in (a reply lost with
--    its connection, say): they are returned with their fields, to be taken
--    in now rather than left pending.
--
-- KEYS[1] stream   KEYS[2] this worker's alive key   KEYS[3] its running hash (the start journal)
-- KEYS[4] its taken set on this stream (ids reclaim.lua took back from it)
-- ARGV[1] consumer group   ARGV[2] this consumer   ARGV[3] alive ttl ms
-- ARGV[4] idle ms after which an unheld entry of this consumer is an orphan
-- ARGV[5] most orphans to return   ARGV[6..] entry ids held
-- Returns {held ids taken back from this consumer, flat list of orphans: id, fields (array)}

local stream, alive, running, taken = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local group, me = ARGV[1], ARGV[2]
redis.call('SET', alive, '1', 'PX', ARGV[3])

local held, lost = {}, {}
local some_taken = redis.call('EXISTS', taken) == 1
for i = 6, #ARGV do
  local id = ARGV[i]
  held[id] = true
  local p = redis.call('XPENDING', stream, group, id, id, 1)
  if #p > 0 and p[1][2] == me then
    redis.call('XCLAIM', stream, group, me, 0, id, 'JUSTID')
  elseif #p > 0 or (some_taken and redis.call('SISMEMBER', taken, id) == 1) then
    lost[#lost + 1] = id  -- pending on another consumer, or put back by a reclaim
  end
end
if some_taken then redis.call('DEL', taken) end

local marks = redis.call('HKEYS', running)
for _, id in ipairs(marks) do
  if not held[id] then
    local p = redis.call('XPENDING', stream, group, id, id, 1)
    if #p == 0 or p[1][2] ~= me then redis.call('HDEL', running, id) end
  end
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
