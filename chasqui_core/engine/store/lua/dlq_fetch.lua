-- Read DLQ entries by id, many in one call: what a bulk replay reads of the
-- entries the DLQ's index matched (a pipeline of single-entry XRANGEs costs the
-- client more than the server's work).
--
-- KEYS[1] dlq
-- ARGV    entry ids
-- Returns one item per id, in order: the entry as XRANGE gives it ({id, {field, value, ...}}), or false
-- when it is gone.

local out = {}
for i = 1, #ARGV do
  local rows = redis.call('XRANGE', KEYS[1], ARGV[i], ARGV[i])
  out[i] = rows[1] or false
end
return out
