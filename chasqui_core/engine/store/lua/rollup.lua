-- Take a queue's snapshots of its all-time counters and run-duration
-- histograms, once per period: what the console's time ranges are read
-- against (engine/ops/history.py). Every worker calls it every few seconds;
-- the first call in a period writes that period's snapshot, the others find
-- it there and write nothing, so the settle path pays nothing for it.
--
-- A snapshot is a hash: `t:<counter>` for each field of the totals hash,
-- each field of the durations hash as it is, and `_at` (server ms when taken).
--
-- KEYS[1] the queue's counters prefix ({chasqui:<q>}:m:)
-- ARGV pairs: snapshot key part (after the prefix, e.g. `snap:5m:`), period in seconds; then, for each pair in
--   the same order, the snapshot's lifetime in seconds. ARGV[1] is the number of pairs.
-- Returns the number of snapshots written.

local mprefix = KEYS[1]
local n = tonumber(ARGV[1])
local now = server_ms()
local written = 0
local totals, durations
for i = 0, n - 1 do
  local part, period, ttl = ARGV[2 + 2 * i], tonumber(ARGV[3 + 2 * i]), tonumber(ARGV[2 + 2 * n + i])
  local key = mprefix .. part .. math.floor(now / (period * 1000))
  if redis.call('EXISTS', key) == 0 then
    if totals == nil then
      totals = redis.call('HGETALL', totals_key(mprefix))
      durations = redis.call('HGETALL', durations_key(mprefix))
    end
    local fields = {'_at', now}
    for k = 1, #totals, 2 do
      fields[#fields + 1] = 't:' .. totals[k]
      fields[#fields + 1] = totals[k + 1]
    end
    for k = 1, #durations do
      fields[#fields + 1] = durations[k]
    end
    call_in_chunks('HSET', key, fields, 1000)
    redis.call('EXPIRE', key, ttl)
    written = written + 1
  end
end
return written
