-- Add a chunk of jobs to a queue in one call.
--
-- KEYS[1]  stream   {chasqui:<q>}:stream
-- KEYS[2]  delayed  {chasqui:<q>}:delayed
-- ARGV[1]  prefix of idempotency markers ({chasqui:<q>}:unique:)
-- ARGV[2]  idempotency window in ms
-- ARGV[3]  prefix of the metrics counters ({chasqui:<q>}:m:)
-- ARGV[4] the jobs, one msgpack array of triples laid flat (one argument per
--         chunk instead of three per job keeps the call cheap to send):
--         job id ("" when the caller gave none), when, payload
--           when = ""      -> ready now (XADD)
--                  "+<ms>" -> delayed by ms from the server's clock (ZADD)
--                  "@<ms>" -> delayed until an absolute epoch ms (ZADD)
-- Returns: one entry per job: the stream id, "delayed", or 0 when a job with
-- the same caller-given id was added within the idempotency window.

local stream, delayed = KEYS[1], KEYS[2]
local unique_prefix, unique_ttl, mprefix = ARGV[1], ARGV[2], ARGV[3]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {}
local added = 0
local items = cmsgpack.unpack(ARGV[4])
for i = 1, #items, 3 do
  local id, when, payload = items[i], items[i + 1], items[i + 2]
  local fresh = true
  if id ~= '' then
    fresh = redis.call('SET', unique_prefix .. id, '1', 'NX', 'PX', unique_ttl)
  end
  if not fresh then
    out[#out + 1] = 0
  elseif when == '' then
    out[#out + 1] = redis.call('XADD', stream, '*', 'j', payload)
    added = added + 1
  else
    local at
    if string.sub(when, 1, 1) == '+' then
      at = now + tonumber(string.sub(when, 2))
    else
      at = tonumber(string.sub(when, 2))
    end
    redis.call('ZADD', delayed, at, payload)
    out[#out + 1] = 'delayed'
    added = added + 1
  end
end
if added > 0 then
  local sec = math.floor(now / 1000)
  local skey, mkey = mprefix .. 's:' .. sec, mprefix .. 'm:' .. math.floor(sec / 60)
  redis.call('HINCRBY', skey, 'enqueued', added)
  redis.call('EXPIRE', skey, 3720)
  redis.call('HINCRBY', mkey, 'enqueued', added)
  redis.call('EXPIRE', mkey, 90000)
end
return out
