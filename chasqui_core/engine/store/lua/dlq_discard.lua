-- Delete dead-letter entries for good, and their place in the DLQ's index.
--
-- KEYS[1] dlq
-- ARGV    entry ids
-- Returns the number of entries deleted (those someone else removed first are not counted).
--
-- A discarded job of a workflow counts as ended there ("gone", flows.lua), which may fire its batch's
-- on_complete callback in this same call.
--
-- Calls dlq_removal, dlq_take and dlq_removal_flush from dlq_index.lua; flow_of and flow_end from flows.lua.

local removal = dlq_removal(KEYS[1])
local removed = 0
for i = 1, #ARGV do
  local fields = dlq_take(removal, ARGV[i])
  if fields then
    removed = removed + 1
    discard_flow_end(KEYS[1], fields)
  end
end
dlq_removal_flush(removal)
return removed
