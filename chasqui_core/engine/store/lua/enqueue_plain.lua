-- Add one plain job: ready now, in the queue's default band, with no caller-given id.
--
-- Most adds are such a job, and a single add waits for this script, so it
-- does only what that job needs: the XADD, the `enqueued` counters and the
-- lane record that makes a re-sent write harmless. enqueue.lua does all of
-- that and more (delays, priority bands, caller-given ids, chunks); each
-- thing it does costs a single add a few microseconds of server time.
--
-- It is loaded without prelude.lua (scripts.py, STANDALONE): defining the
-- prelude's helpers on every call would cost it a tenth of its time. So it
-- bumps the counters itself, exactly as the prelude's bump_counters does
-- (tests/engine/test_plain_add.py holds the two to the same keys, fields and
-- lifetimes), and dates them by the entry id XADD returns: the server's
-- clock in milliseconds (or the stream's last id, should the clock step back),
-- without a TIME call.
--
-- KEYS[1]  stream   {chasqui:<q>}:stream
-- KEYS[2]  lane     {chasqui:<q>}:lane:<lane id>: the last write of one
--                   producer lane, as "<seq>:<reply>"
-- KEYS[3]  totals   {chasqui:<q>}:m:total, the queue's all-time counters
-- ARGV[1]  prefix of the per-second counter buckets ({chasqui:<q>}:m:s:)
-- ARGV[2]  prefix of the per-minute counter buckets ({chasqui:<q>}:m:m:)
-- ARGV[3]  a per-second bucket's lifetime in seconds
-- ARGV[4]  a per-minute bucket's lifetime in seconds
-- ARGV[5]  how long a lane remembers its last write, in ms
-- ARGV[6]  this write's sequence number in its lane (fixed before the first try)
-- ARGV[7]  "1" when the write is sent again after a try whose reply was lost,
--          "" on its first try (which cannot find its own number: not read)
-- ARGV[8]  the job's envelope
-- Returns: the stream entry id. A re-sent write whose lane holds its
-- sequence number was applied before: it changes nothing and returns the
-- entry id of that first write.

local call, lane, seq = redis.call, KEYS[2], ARGV[6]
if ARGV[7] ~= '' then
  local last = call('GET', lane)
  if last and string.sub(last, 1, #seq + 1) == seq .. ':' then
    return string.sub(last, #seq + 2)
  end
end
local id = call('XADD', KEYS[1], '*', 'j', ARGV[8])
-- the entry id's milliseconds without their last three digits: the second
local sec = string.sub(id, 1, string.find(id, '-', 1, true) - 4)
local skey = ARGV[1] .. sec
if call('HINCRBY', skey, 'enqueued', 1) == 1 then
  call('EXPIRE', skey, ARGV[3])
end
local mkey = ARGV[2] .. math.floor(tonumber(sec) / 60)
if call('HINCRBY', mkey, 'enqueued', 1) == 1 then
  call('EXPIRE', mkey, ARGV[4])
end
call('HINCRBY', KEYS[3], 'enqueued', 1)
call('SET', lane, seq .. ':' .. id, 'PX', ARGV[5])
return id
