-- Take back the entries of workers that died (crash recovery).
--
-- An entry pending on a consumer idle past the visibility timeout is taken
-- only when that consumer's alive key is gone (lease.lua keeps it while the
-- worker lives): a slow worker keeps its jobs. Each entry taken goes back to
-- the stream's tail as a new entry, in one step (XACK, XDEL, XADD), so any
-- worker reads it as an ordinary job.
--
-- Only a run that was under way is lost: the owner's start journal (its
-- running hash, written before each handler started) says which. Such an
-- entry carries a `lost` field, one line per lost run appended to any it
-- had: "<worker>\t<started ms>\t<lost at ms>\t<verdict>". The verdict is
-- `died` when the owner's death is on record (<prefix>died:<worker>, written
-- by whoever saw the process end: its supervisor, recovery.record_death),
-- else `contact`: the worker stopped answering,
-- but nothing says its process ended (a partition, a blocked event loop) and
-- it may have finished the run. A line without a verdict (written before
-- verdicts existed) is a death. The worker that reads the entry charges each
-- line to the job as a run (attempt, error history; a death only for `died`)
-- and applies the attempt budget and the poison-pill rule (see retry.py):
-- one rule, in one place (recovery.lost_runs reads these lines). An entry
-- fetched but never started goes back exactly as it was, uncharged. An entry
-- put back also carries a `recovered` field, the number of dead workers
-- (death on record) that took it back while it was running or about to
-- start: a job that kills its worker before anything could note it running
-- is caught by that count instead (retry.RECOVERIES_BEFORE_PANIC). "About to
-- start" is the owner's dispatching set (<ARGV[11]><worker>: the ids of the
-- round of starts its event loop was in, journal.py). An entry the dead
-- worker had only fetched does not raise it: crash after crash of other jobs
-- must not make it a `panic`. A worker with no death on record does not
-- raise it either: lost contact never counts toward panic (a partition past
-- the visibility timeout takes back every entry a live worker held).
--
-- A run the dead worker noted ended on its host is in its ended set
-- (<ARGV[12]><worker>, written by the recorder of its death with the strikes,
-- recovery.strike_ended_runs): its start mark, should the network deliver it
-- after those strikes, does not make the run lost.
--
-- Every id taken from a worker is added to its taken set (<ARGV[9]><worker>,
-- TTL ARGV[10] ms): should the worker still live, its lease pass tells these
-- from entries it settled meanwhile (lease.lua), and lets go of them.
--
-- KEYS[1] stream
-- ARGV[1] consumer group   ARGV[2] claiming consumer (its own entries are the lease pass's)
-- ARGV[3] min idle ms      ARGV[4] most pending entries to look at
-- ARGV[5] first id to look at ('-' at first, then '(' .. the last id returned)
-- ARGV[6] the queue's key prefix ({chasqui:<q>}:), for <prefix>alive:<worker> and <prefix>died:<worker>
-- ARGV[7] prefix of the metrics counters
-- ARGV[8] prefix of the start journals of this stream's band: <ARGV[8]><worker>
--         ({chasqui:<q>}:running: for the default band, running-high: ...)
-- ARGV[9] prefix of the taken sets of this stream's band ({chasqui:<q>}:taken:, taken-high: ...)
-- ARGV[10] lifetime of a taken set, ms
-- ARGV[11] prefix of the dispatching sets of this stream's band ({chasqui:<q>}:dispatching:, dispatching-high: ...)
-- ARGV[12] prefix of the ended sets of this stream's band ({chasqui:<q>}:ended:, ended-high: ...)
-- Returns {last id looked at or '' when the scan is done,
--          flat list of entries put back: old id, new id, 0 uncharged / 1 charged a death / 2 lost contact}
--
-- Counts `recovered` (put back uncharged), `lost` (runs lost with a worker whose death is on record) and
-- `lost_contact` (runs of a worker that stopped answering). Calls server_ms and bump_counters from prelude.lua.

local stream = KEYS[1]
local group, me, prefix = ARGV[1], ARGV[2], ARGV[6]
local pending = redis.call('XPENDING', stream, group, 'IDLE', ARGV[3], ARGV[5], '+', ARGV[4])
local now = server_ms()
local alive, died = {}, {}
local out = {}
local recovered, lost, contact = 0, 0, 0
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
      local taken = ARGV[9] .. owner
      redis.call('SADD', taken, id)
      redis.call('PEXPIRE', taken, ARGV[10])
      if #e > 0 then
        local running = ARGV[8] .. owner
        local started = redis.call('HGET', running, id)
        if started and redis.call('SISMEMBER', ARGV[12] .. owner, id) == 1 then
          redis.call('HDEL', running, id)
          started = false
        end
        local fields, line, had, verdict = e[1][2], nil, false, nil
        if died[owner] == nil then
          died[owner] = redis.call('EXISTS', prefix .. 'died:' .. owner) == 1
        end
        local dispatching = ARGV[11] .. owner
        local about_to_start = redis.call('SREM', dispatching, id) == 1
        if started then
          verdict = died[owner] and 'died' or 'contact'
          line = owner .. '\t' .. started .. '\t' .. now .. '\t' .. verdict
          redis.call('HDEL', running, id)
        end
        local copy = {}
        local times = 0
        for k = 1, #fields, 2 do
          local name, value = fields[k], fields[k + 1]
          if name == 'lost' then
            had = true
            if line then value = value .. '\n' .. line end
          end
          if name == 'recovered' then
            times = tonumber(value) or 0
          else
            copy[#copy + 1] = name
            copy[#copy + 1] = value
          end
        end
        if line and not had then
          copy[#copy + 1] = 'lost'
          copy[#copy + 1] = line
        end
        if died[owner] and (started or about_to_start) then times = times + 1 end
        if times > 0 then
          copy[#copy + 1] = 'recovered'
          copy[#copy + 1] = times
        end
        redis.call('XDEL', stream, id)
        local new_id = redis.call('XADD', stream, '*', unpack(copy))
        out[#out + 1] = id
        out[#out + 1] = new_id
        if verdict == 'died' then
          out[#out + 1] = 1
          lost = lost + 1
        elseif verdict == 'contact' then
          out[#out + 1] = 2
          contact = contact + 1
        else
          out[#out + 1] = 0
          recovered = recovered + 1
        end
      end
    end
  end
end
if recovered + lost + contact > 0 then
  bump_counters(ARGV[7], now, {'recovered', recovered, 'lost', lost, 'lost_contact', contact})
end
if #pending < tonumber(ARGV[4]) then last = '' end
return {last, out}
