-- Leave an operator's command for one worker (see engine/ops/control.py).
--
-- A stop is never replaced by a quiet, and a command already waiting is not
-- written again, so the caller can tell an operator "it was already asked".
--
-- KEYS[1] the worker's control key (chasqui:control:<worker id>)
-- ARGV[1] the command: 'quiet' or 'stop'   ARGV[2] seconds the command keeps before it expires
-- Returns false when the command was written; otherwise the command already there ('quiet' or 'stop').

local current = redis.call('GET', KEYS[1])
if current == ARGV[1] or current == 'stop' then
  return current
end
redis.call('SET', KEYS[1], ARGV[1], 'EX', tonumber(ARGV[2]))
return false
