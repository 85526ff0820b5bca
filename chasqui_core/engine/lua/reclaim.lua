-- Take back the entries of workers that died (crash recovery).
--
-- An entry pending on a consumer idle past the visibility timeout is taken
-- only when that consumer's alive key is gone (lease.lua keeps it while the
-- worker lives): a slow worker keeps its jobs. Each entry taken goes back to
-- the stream's tail as a new entry, in one step (XACK, XDEL, XADD), so any
-- worker reads it as an ordinary job.
--
-- Only a run that was under way is lost: the dead worker's start journal
-- (its running hash, written before each handler started) says which. Such
-- an entry carries a `lost` field, one line per lost run appended to any it
-- had: "<worker>\t<started ms>\t<lost at ms>". The worker that reads it
-- charges each line to the job as a run (attempt, deaths, error history)
-- and applies the attempt budget and the poison-pill rule (see retry.py):
-- one rule, in one place. An entry fetched but never started goes back
-- exactly as it was, uncharged. Every entry put back also carries a
-- `recovered` field, the number of dead workers it has been taken back from,
-- charged or not: a job that kills its worker before anything could note it
-- running is caught by that count instead (retry.RECOVERIES_BEFORE_PANIC).
--
-- KEYS[1] stream
-- ARGV[1] consumer group   ARGV[2] claiming consumer (its own entries are the lease pass's)
-- ARGV[3] min idle ms      ARGV[4] most pending entries to look at
-- ARGV[5] first id to look at ('-' at first, then '(' .. the last id returned)
-- ARGV[6] the queue's key prefix ({chasqui:<q>}:), for <prefix>alive:<worker>
-- ARGV[7] prefix of the metrics counters
-- ARGV[8] prefix of the start journals of this stream's band: <ARGV[8]><worker>
--         ({chasqui:<q>}:running: for the default band, running-high: ...)
-- Returns {last id looked at or '' when the scan is done,
--          flat list of entries put back: old id, new id, 1 when a lost run was charged else 0}
--
-- Calls server_ms and bump_counters from prelude.lua.

local stream = KEYS[1]
local group, me, prefix = ARGV[1], ARGV[2], ARGV[6]
local pending = redis.call('XPENDING', stream, group, 'IDLE', ARGV[3], ARGV[5], '+', ARGV[4])
local now = server_ms()
local alive = {}
local out = {}
local recovered, lost = 0, 0
local last = ''
for _, p in ipairs(pending) do
  local id, owner = p[1], p[2]
  last = id
  if owner ~= me then
    if alive[owner] == nil then
      alive[owner] = redis.call('EXISTS', prefix .. 'alive:' .. owner) == 1
    end
    if not alive[owner] then
      local e = redis.call('XRANGE', stream, id, id)
      redis.call('XACK', stream, group, id)
      if #e > 0 then
        local running = ARGV[8] .. owner
        local started = redis.call('HGET', running, id)
        local fields, line, had = e[1][2], nil, false
        if started then
          line = owner .. '\t' .. started .. '\t' .. now
          redis.call('HDEL', running, id)
        end
        local copy = {}
        local times = 1
        for k = 1, #fields, 2 do
          local name, value = fields[k], fields[k + 1]
          if name == 'lost' then
            had = true
            if line then value = value .. '\n' .. line end
          end
          if name == 'recovered' then
            times = (tonumber(value) or 0) + 1
          else
            copy[#copy + 1] = name
            copy[#copy + 1] = value
          end
        end
        if line and not had then
          copy[#copy + 1] = 'lost'
          copy[#copy + 1] = line
        end
        copy[#copy + 1] = 'recovered'
        copy[#copy + 1] = times
        redis.call('XDEL', stream, id)
        local new_id = redis.call('XADD', stream, '*', unpack(copy))
        out[#out + 1] = id
        out[#out + 1] = new_id
        if line then
          out[#out + 1] = 1
          lost = lost + 1
        else
          out[#out + 1] = 0
          recovered = recovered + 1
        end
      end
    end
  end
end
if recovered + lost > 0 then
  bump_counters(ARGV[7], now, {'recovered', recovered, 'lost', lost})
end
if #pending < tonumber(ARGV[4]) then last = '' end
return {last, out}
