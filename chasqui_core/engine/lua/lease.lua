-- Renew the lease on entries a worker still holds, and only on those.
--
-- XCLAIM with JUSTID resets an entry's idle time without counting a
-- delivery; done blindly it would also take back an entry that another
-- worker has already reclaimed, and the job would run twice. So each entry is
-- renewed only while the pending list still names this consumer as its owner.
--
-- KEYS[1] stream
-- ARGV[1] consumer group   ARGV[2] this consumer   ARGV[3..] entry ids
-- Returns the ids that are no longer this consumer's (lost to a reclaim).

local stream, group, me = KEYS[1], ARGV[1], ARGV[2]
local lost = {}
for i = 3, #ARGV do
  local p = redis.call('XPENDING', stream, group, ARGV[i], ARGV[i], 1)
  if #p > 0 and p[1][2] == me then
    redis.call('XCLAIM', stream, group, me, 0, ARGV[i], 'JUSTID')
  else
    lost[#lost + 1] = ARGV[i]
  end
end
return lost
