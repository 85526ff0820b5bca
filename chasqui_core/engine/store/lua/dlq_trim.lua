-- Trim a DLQ to its retention rule: the oldest entries first, each taken out of
-- the DLQ's index in the same call (dlq_take), counted as dlq_trimmed.
--
-- An entry goes while the DLQ holds more than the most entries kept, or while it
-- is older than the oldest age kept (its id's millisecond against server time).
-- A call removes at most ARGV[3] entries, so it never holds the server long; the
-- caller calls again while a call removes as many as it may.
--
-- KEYS[1] dlq
-- ARGV[1] most entries kept ('' = no count limit)   ARGV[2] oldest age kept in ms ('' = no age limit)
-- ARGV[3] at most this many removed by this call   ARGV[4] the queue's counters prefix ({chasqui:<q>}:m:)
-- Returns the number of entries removed.
--
-- Calls server_ms and bump_counters from prelude.lua; dlq_removal, dlq_take and dlq_removal_flush from
-- dlq_index.lua.

local dlq = KEYS[1]
local most = math.floor(tonumber(ARGV[3]))
local excess = 0
if ARGV[1] ~= '' then
  excess = math.max(0, redis.call('XLEN', dlq) - tonumber(ARGV[1]))
end
local now = server_ms()
local cutoff = nil
if ARGV[2] ~= '' then
  cutoff = now - tonumber(ARGV[2])
end
if excess == 0 and not cutoff then
  return 0
end
-- only what must go is read: the oldest entries over the count, then those older than the cutoff
local rows = {}
if excess > 0 then
  rows = redis.call('XRANGE', dlq, '-', '+', 'COUNT', math.min(most, excess))
end
if cutoff and #rows < most then
  local from = '-'
  if #rows > 0 then
    from = '(' .. rows[#rows][1]
  end
  local old = redis.call('XRANGE', dlq, from, '(' .. string.format('%.0f', cutoff) .. '-0', 'COUNT', most - #rows)
  for _, row in ipairs(old) do
    rows[#rows + 1] = row
  end
end
local removal = dlq_removal(dlq)
local trimmed = 0
for _, row in ipairs(rows) do
  if dlq_take(removal, row[1]) then
    trimmed = trimmed + 1
  end
end
dlq_removal_flush(removal)
if trimmed > 0 then
  bump_counters(ARGV[4], now, {'dlq_trimmed', trimmed})
end
return trimmed
