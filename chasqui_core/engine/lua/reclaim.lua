-- Take over deliveries whose worker stopped answering (crash recovery).
--
-- XAUTOCLAIM claims entries idle longer than the visibility timeout; their
-- delivery counts say how many runs were lost. An entry delivered more than
-- the allowed number of times killed its workers: it goes to the dead-letter
-- queue as a poison pill ("panic") in the same call, never to a worker again.
--
-- KEYS[1] stream   KEYS[2] dlq   KEYS[3] events
-- ARGV[1] consumer group    ARGV[2] claiming consumer
-- ARGV[3] min idle ms       ARGV[4] most entries to claim
-- ARGV[5] scan cursor (start id, "0-0" at first)
-- ARGV[6] deliveries allowed before an entry counts as a poison pill
-- ARGV[7] prefix of the metrics counters (all-time totals in <prefix>total)
-- ARGV[8] approximate cap of the events stream
-- Returns {next cursor, flat list of claimed entries: id, fields (array), deliveries}

local stream, dlq, events = KEYS[1], KEYS[2], KEYS[3]
local group, consumer = ARGV[1], ARGV[2]
local max_deliveries = tonumber(ARGV[6])
local mprefix, evcap = ARGV[7], ARGV[8]
local res = redis.call('XAUTOCLAIM', stream, group, consumer, ARGV[3], ARGV[5], 'COUNT', ARGV[4])
local out = {}
local panics = 0
for _, entry in ipairs(res[2]) do
  local id, fields = entry[1], entry[2]
  if not fields or fields == false then
    -- entry deleted while pending (Redis 6.2 reports it this way): nothing to run
    redis.call('XACK', stream, group, id)
  else
    local p = redis.call('XPENDING', stream, group, id, id, 1)
    local deliveries = 1
    if #p > 0 then deliveries = tonumber(p[1][4]) end
    if deliveries > max_deliveries then
      local payload, task, job_id = '', '', ''
      for k = 1, #fields, 2 do
        if fields[k] == 'j' then payload = fields[k + 1] end
      end
      redis.call('XACK', stream, group, id)
      redis.call('XDEL', stream, id)
      redis.call('XADD', dlq, '*', 'j', payload, 'reason', 'panic', 'task', '', 'job_id', '',
        'source_id', id, 'error_class', 'WorkerLost',
        'error', 'the job was running when its worker died ' .. (deliveries - 1) .. ' times',
        'deliveries', deliveries)
      redis.call('XADD', events, 'MAXLEN', '~', evcap, '*', 'type', 'dlq', 'reason', 'panic', 'source_id', id)
      panics = panics + 1
    else
      out[#out + 1] = id
      out[#out + 1] = fields
      out[#out + 1] = deliveries
    end
  end
end
if panics > 0 then
  local t = redis.call('TIME')
  local sec = tonumber(t[1])
  local skey, mkey = mprefix .. 's:' .. sec, mprefix .. 'm:' .. math.floor(sec / 60)
  redis.call('HINCRBY', skey, 'dlq', panics)
  redis.call('EXPIRE', skey, 3720)
  redis.call('HINCRBY', mkey, 'dlq', panics)
  redis.call('EXPIRE', mkey, 90000)
  redis.call('HINCRBY', mprefix .. 'total', 'dlq', panics)
end
return {res[1], out}
